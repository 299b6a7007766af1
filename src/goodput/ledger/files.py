"""Reading a run's ledger files: which there are, and their events (a torn last line ignored).

Split from :mod:`goodput.ledger.ledger`, which writes them; a long run's report reads only one rank's steps.
Steps come from the attempt's step-record file (:mod:`goodput.ledger.steps`) as ``step_start``/``step_end``
events, or from its JSON lines in a ledger written before that format: either reads the same.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from goodput.errors import ConfigError
from goodput.ledger.index import NOT_INDEXED, index_path, read_index
from goodput.ledger.steps import STEPS_SUFFIX, last_step_end, read_records, records_to_events, steps_path

if TYPE_CHECKING:
    import numpy as np

__all__ = ["LEDGER_DIR", "LedgerFile", "ledger_files", "read_events", "read_ledger"]

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
    return [LedgerFile(attempt, rank, folder / name) for attempt, rank, name in _names(folder)]


def _names(folder: Path) -> list[tuple[int, int, str]]:
    """(attempt, rank, file name) of the folder's JSONL files, sorted: no ``Path`` for each (a long run has tens
    of thousands, and the report reads most of them from the attempts' indexes)."""
    try:
        entries = [entry.name for entry in os.scandir(folder)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in entries:
        if name.endswith(".jsonl") and (match := _FILE.match(name)):
            found.append((int(match.group(1)), int(match.group(2)), name))
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
        steps = steps_of is None or f.rank == steps_of
        records = read_records(steps_path(f.path), tail=not steps)
        stepped = records_to_events(records, f.attempt, f.rank)
        if not steps:
            stepped = [e for e in stepped if e["event"] == "step_end"]
        own = _read_file(f.path, steps=steps)
        events.extend(heapq.merge(own, stepped, key=_mono) if stepped else own)
    return events


def read_ledger(
    run_dir: str | os.PathLike[str], *, primary: int | None = None
) -> tuple[list[dict[str, Any]], dict[tuple[int, int], np.ndarray]]:
    """What the report reads: every rank's events but ``primary``'s step records, which come as arrays by
    (attempt, rank) (:func:`goodput.ledger.steps.read_records`), and of the other ranks only each file's last
    step and, of their built-in events, only the attempt starts and failures (the merge of the ranks counts no
    other). Those of another rank come from the attempt's index (:mod:`goodput.ledger.index`) where its entry
    there is whole, else from its files. A file of the older format (steps as JSON lines) gives its steps as
    events. When ``primary`` (None, or a rank without files: the lowest rank present) started no attempt, the
    report takes another rank's time axis: every event of every rank, and no records.

    Raises:
        ConfigError: when ``run_dir`` holds no ledger.
    """
    folder = Path(run_dir) / LEDGER_DIR
    names = _names(folder)
    if not names:
        read_events(run_dir)  # raises the error that names what is missing
    ranks = {rank for _, rank, _ in names}
    chosen = primary if primary in ranks else min(ranks)
    events: list[dict[str, Any]] = []
    records: dict[tuple[int, int], np.ndarray] = {}
    for attempt, group in itertools.groupby(names, key=lambda n: n[0]):
        here = list(group)
        others = {rank for _, rank, _ in here} - {chosen}
        indexed = read_index(index_path(folder, attempt), others) if others else {}
        for _, rank, name in here:
            if rank in indexed:
                events.extend(indexed[rank])
            elif rank != chosen:
                events.extend(_job_events(LedgerFile(attempt, rank, folder / name)))
            else:
                table = read_records(steps_path(folder / name))
                if len(table):
                    records[(attempt, rank)] = table
                # without records (the older format), the primary's steps are JSON lines: read them all
                events.extend(_read_file(folder / name, steps=not len(table)))
    if not any(e.get("event") == "attempt_start" and e.get("rank", 0) == chosen for e in events):
        return read_events(run_dir, rank=None), {}
    return events, records


def _mono(event: dict[str, Any]) -> tuple[float, int]:
    """Merge order: time, and at the same instant a step's end before other events and its start after."""
    mono = event.get("mono")
    name = event.get("event")
    return float(mono) if isinstance(mono, int | float) else 0.0, 0 if name == "step_end" else (
        2 if name == "step_start" else 1
    )


# The step events as Ledger writes them (compact) and as json.dumps would (a space after the colon).
_STEP_PREFIXES = (b'{"event":"step_', b'{"event": "step_')
_STEP_END_PREFIXES = (b'{"event":"step_end"', b'{"event": "step_end"')
# Of another rank's lines, those the merge of the ranks may count (ranks.py): every line but its steps and
# the built-in events other than its attempt start and failures, which read_ledger leaves unparsed; the same
# lines its writer appends to the attempt's index.
_JOB_LINES = re.compile(
    rb'^(?!\{"event": ?"(?:' + "|".join(sorted(NOT_INDEXED)).encode() + rb')")[^\n]+', re.MULTILINE
)


def _job_events(f: LedgerFile) -> list[dict[str, Any]]:
    """What the report reads of a rank other than the primary: its job lines (:data:`_JOB_LINES`) and its
    last ended step, from its step records or, in the older format, its last ``step_end`` line."""
    path = os.fspath(f.path)
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    events = []
    for match in _JOB_LINES.finditer(data):
        event = _parse(match.group(), path, data, match.start())
        if event is not None:
            events.append(event)
    last = last_step_end(path[: -len(".jsonl")] + STEPS_SUFFIX, f.attempt, f.rank)
    if last is None and (found := _last_step_end_line(data)) is not None:
        last = _parse(found[0], path, data, found[1])
    return [*events, last] if last is not None else events


def _last_step_end_line(data: bytes) -> tuple[bytes, int] | None:
    """The last ``step_end`` line of a file of the older format, and its offset."""
    at = max(data.rfind(b"\n" + prefix) for prefix in _STEP_END_PREFIXES)
    if at >= 0:
        at += 1
    elif data.startswith(_STEP_END_PREFIXES):
        at = 0
    else:
        return None
    stop = data.find(b"\n", at)
    return data[at : stop if stop >= 0 else len(data)], at


def _read_file(path: Path, *, steps: bool = True) -> list[dict[str, Any]]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    last_step_end = -1
    if not steps:
        last_step_end = next(
            (i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(_STEP_END_PREFIXES)), -1
        )
    events = []
    name, at = os.fspath(path), 0
    for i, line in enumerate(lines):
        offset, at = at, at + len(line) + 1
        if not steps and i != last_step_end and line.startswith(_STEP_PREFIXES):
            continue  # another rank's step: not parsed (see read_events)
        event = _parse(line, name, data, offset)
        if event is not None:
            events.append(event)
    return events


def _parse(line: bytes, path: str, data: bytes, offset: int) -> dict[str, Any] | None:
    """The event on one line of ``data`` (at ``offset``); None for a blank line, or one that is not an event
    (warned: a torn last line is a process killed mid-write)."""
    if not line.strip():
        return None
    try:
        event = json.loads(line)
        if not isinstance(event, dict) or "event" not in event:
            raise ValueError("not an event object")
    except ValueError:
        torn = offset + len(line) == len(data)  # no newline after it: the write was cut short
        number = data.count(b"\n", 0, offset) + 1
        what = "torn last line" if torn else f"unreadable line {number}"
        warnings.warn(
            f"ledger {path}: ignored {what} ({len(line)} bytes; the process was probably killed mid-write)",
            stacklevel=4,
        )
        return None
    return event
