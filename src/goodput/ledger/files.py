"""Reading a run's ledger files: which there are, and their events (a torn last line ignored).

Split from :mod:`goodput.ledger.ledger`, which writes them; a long run's report reads only one rank's steps.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, NamedTuple

from goodput.errors import ConfigError

__all__ = ["LEDGER_DIR", "LedgerFile", "ledger_files", "read_events"]

LEDGER_DIR = "ledger"
_FILE = re.compile(r"^attempt-(\d+)\.rank-(\d+)\.jsonl$")


class LedgerFile(NamedTuple):
    """One ledger file: the attempt and rank that wrote it."""

    attempt: int
    rank: int
    path: Path


def ledger_files(run_dir: str | os.PathLike[str]) -> list[LedgerFile]:
    """The run's ledger files, sorted by attempt then rank (empty when there are none)."""
    folder = Path(run_dir) / LEDGER_DIR
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(LedgerFile(int(match.group(1)), int(match.group(2)), entry))
    return sorted(found)


def read_events(
    run_dir: str | os.PathLike[str], *, rank: int | None = 0, steps_of: int | None = None
) -> list[dict[str, Any]]:
    """Every event of one rank (all attempts, in file order), or of every rank with ``rank=None``.

    When ``rank`` has no files, the lowest rank that has them is read instead. A torn last line (a process
    killed mid-write) is ignored with a warning, as is any other line that is not a JSON object.

    Args:
        run_dir: the run folder.
        rank: whose events (None: every rank's).
        steps_of: with ``rank=None``, read every ``step_start``/``step_end`` of this rank only; of the other
            ranks only each file's last ``step_end`` (the report's merge counts no other rank's steps, and a
            long run's ledger is mostly steps). None reads every line.

    Raises:
        ConfigError: when ``run_dir`` holds no ledger.
    """
    files = ledger_files(run_dir)
    if not files:
        raise ConfigError(
            f"{os.fspath(run_dir)!r} has no ledger ({LEDGER_DIR}/attempt-*.rank-*.jsonl): "
            "pass the run folder given to goodput.Run or goodput.Ledger"
        )
    if rank is not None:
        ranks = {f.rank for f in files}
        chosen = rank if rank in ranks else min(ranks)
        files = [f for f in files if f.rank == chosen]
    events: list[dict[str, Any]] = []
    for f in files:
        events.extend(_read_file(f.path, steps=steps_of is None or f.rank == steps_of))
    return events


# The step events as Ledger writes them (compact) and as json.dumps would (a space after the colon).
_STEP_PREFIXES = (b'{"event":"step_', b'{"event": "step_')
_STEP_END_PREFIXES = (b'{"event":"step_end"', b'{"event": "step_end"')


def _read_file(path: Path, *, steps: bool = True) -> list[dict[str, Any]]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    last_step_end = -1
    if not steps:
        last_step_end = next(
            (i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(_STEP_END_PREFIXES)), -1
        )
    events = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if not steps and i != last_step_end and line.startswith(_STEP_PREFIXES):
            continue  # another rank's step: not parsed (see read_events)
        try:
            event = json.loads(line)
            if not isinstance(event, dict) or "event" not in event:
                raise ValueError("not an event object")
        except ValueError:
            torn = i == len(lines) - 1  # no newline after it: the write was cut short
            what = "torn last line" if torn else f"unreadable line {i + 1}"
            warnings.warn(
                f"ledger {path}: ignored {what} ({len(line)} bytes; the process was probably killed mid-write)",
                stacklevel=3,
            )
            continue
        events.append(event)
    return events
