"""Each attempt's index: what the report reads of every rank but one, in one small file per attempt.

The report reads all of one rank's events (its time axis) and, of every other rank, only what the merge of the
ranks counts (:mod:`goodput.ledger.ranks`): its *job lines* (every event but its steps and the built-in events
listed in :data:`NOT_INDEXED`) and its last ended step. A long run has thousands of attempts of tens of ranks,
and opening two files per attempt and rank is what its report would spend its time on. So every rank's writer
also appends its job lines to ``attempt-AAAA.index`` beside the attempt's files, and when it closes, one *end*
line naming the rank and holding its last ended step::

    {"index_end": RANK, "lines": N, "last": <the step_end event of its last ended step, or null>}

Each flush appends that rank's lines with one ``O_APPEND`` write, so ranks never interleave inside a line (local
filesystems append one write whole). The report takes a rank's events from the index only when its entry is
whole: exactly one ``attempt_start``, first, an end line last, and between them the ``N`` job lines the end line
counts. The count catches a line that another writer's append overwrote without leaving a torn line behind (NFS
emulates ``O_APPEND``: two appends can land at one offset, the longer one replacing the other). A rank killed
before it closed (no end line), an attempt opened twice for one rank, or an index with a line that does not
parse (a write cut short: which rank lost a line is unknown) is read from the rank's own files instead, which
always hold the same events: the index is a shortcut, never the only copy. Attempts written before the index
have none and read as before.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from goodput.ledger.steps import RECORD, step_end_event

__all__ = ["INDEX_SUFFIX", "NOT_INDEXED", "IndexWriter", "end_line", "index_path", "read_index"]

INDEX_SUFFIX = ".index"
# Built-in events the merge of the ranks never counts of a rank other than the primary: left out of the index
# (and unparsed in that rank's JSONL). Steps are records, or JSON lines in the older format.
NOT_INDEXED = frozenset(
    {
        "step_start",
        "step_end",
        "init_done",
        "restore_start",
        "restore_end",
        "checkpoint_stall_start",
        "checkpoint_stall_end",
        "checkpoint_durable",
        "attempt_end",
    }
)


def index_path(folder: Path, attempt: int) -> Path:
    """The index of ``attempt`` in the ledger folder."""
    return folder / f"attempt-{attempt:04d}{INDEX_SUFFIX}"


class IndexWriter:
    """One rank's lines in its attempt's index (internal to ``goodput.Ledger``, whose locks its callers hold:
    :meth:`add` its lock, :meth:`write` and :meth:`close` its write lock).

    Args:
        path: the attempt's index, or None to write none (the older writer the bench compares with).
        rank: whose lines.
    """

    def __init__(self, path: Path | None, rank: int) -> None:
        self.path = path
        self.rank = rank
        self._pending: list[bytes] = []
        self._lines = 0  # job lines written whole: the end line's count
        self._last_line: bytes | None = None  # the last step_end written as a JSON line (older callers)
        self._fd = -1
        self._broken = path is None

    def add(self, name: str, line: bytes) -> None:
        """An event line as the JSONL got it: queued when the report reads it of every rank."""
        if self.path is None:
            return
        if name not in NOT_INDEXED:
            self._pending.append(line)
        elif name == "step_end":
            self._last_line = line

    def take(self) -> bytes:
        data, self._pending = b"".join(self._pending), []
        return data

    def write(self, data: bytes, *, fsync: bool) -> None:
        """Append ``data`` with one write; a write cut short ends this rank's index (its files are read)."""
        if not data or self._broken:
            return
        if self._fd < 0:
            assert self.path is not None
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if os.write(self._fd, data) != len(data):
            self._broken = True
            return
        self._lines += data.count(b"\n")
        if fsync:
            os.fsync(self._fd)

    def failed(self) -> None:
        """A write of the attempt's files failed: the index may hold what they do not, so it ends here."""
        self._broken = True

    def close(self, last_record: bytes, attempt: int, *, fsync: bool) -> None:
        """Append the end line (whatever was written is whole) and close; ``last_record`` is the step record
        that ended last, empty when none did."""
        with contextlib.suppress(OSError):  # else no end line: the report reads this rank's files
            self.write(
                end_line(self.rank, attempt, last_record, self._last_line, lines=self._lines), fsync=fsync
            )
        self._broken = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def end_line(
    rank: int, attempt: int, last_record: bytes, last_line: bytes | None = None, *, lines: int
) -> bytes:
    """A rank's end line after its ``lines`` job lines: its last ended step from the record that ended last
    (empty when none did), else from its last ``step_end`` JSON line (a caller that records steps as events;
    None when there is none)."""
    if last_record:
        last = json.dumps(step_end_event(RECORD.unpack(last_record), attempt, rank)).encode()
    else:
        last = b"null" if last_line is None else last_line.strip()
    return b'{"index_end":%d,"lines":%d,"last":%s}\n' % (rank, lines, last)


def read_index(path: Path, ranks: set[int]) -> dict[int, list[dict[str, Any]]]:
    """The events of each of ``ranks`` whose entry in the index is whole, in the order its JSONL holds them, its
    last ended step after them; a rank left out is to be read from its files (so is every rank, when the file
    is missing or a line of it does not parse)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return {}
    try:
        data = os.read(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    if not data.endswith(b"\n"):
        return {}  # a write cut short
    try:  # one parse for the whole file: a long run's report reads a thousand of them
        lines = json.loads(b"[" + data[:-1].replace(b"\n", b",") + b"]")
    except ValueError:
        return {}
    entries: dict[int, list[dict[str, Any]]] = {}
    whole: set[int] = set()
    broken: set[int] = set()
    for line in lines:
        if not isinstance(line, dict):
            return {}
        ending = "index_end" in line
        rank = line["index_end"] if ending else line.get("rank")
        if not isinstance(rank, int):
            return {}
        if rank in whole:
            broken.add(rank)  # a line after the rank's end: the attempt was opened again
        elif ending:
            whole.add(rank)
            last = line.get("last")
            if (
                rank not in entries
                or not isinstance(last, dict | None)
                or line.get("lines") != len(entries[rank])
            ):
                broken.add(rank)  # no attempt_start, or a line lost
            elif last is not None:
                entries[rank].append(last)
        else:
            events = entries.setdefault(rank, [])
            if (line.get("event") == "attempt_start") != (not events):
                broken.add(rank)  # no attempt_start first, or a second one
            events.append(line)
    return {rank: entries[rank] for rank in ranks & whole if rank not in broken}
