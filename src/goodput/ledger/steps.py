"""The ledger's step records: one fixed-size binary record per step, in a file beside the attempt's JSONL.

A long run's ledger is almost all steps (two JSON lines per step, ~200 bytes, and a ``json.loads`` each to read
back). ``goodput.Ledger`` writes them instead as records of :data:`RECORD` (48 bytes, little-endian) to
``attempt-AAAA.rank-RRRRR.steps``: packing one costs less than formatting a JSON line, and the report reads a
file of them as one array (:func:`read_records`) rather than line by line. Every other event stays in the JSONL.

A record is written when its step ends: ``step``, ``start`` and ``end`` (``time.monotonic()``), ``fetch``
(seconds waiting for the batch), ``loss`` (NaN when none) and ``wall`` (``time.time()`` at the end). A step
that has begun and not ended is written as an *open* record (``end`` NaN, ``wall`` at its start) when a flush
finds it running, when a later step begins without it ending (a shrink interrupted it) or when the ledger
closes; an open record whose step later ends is superseded by that step's full record (same step and start).
A record cut short by a kill is ignored with a warning, as a torn JSON line is.

Ledgers written before this format hold ``step_start``/``step_end`` JSON lines and no ``.steps`` file; both
read the same through :func:`goodput.ledger.read_events`, which turns records back into those events.
"""

from __future__ import annotations

import os
import struct
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "HEADER",
    "RECORD",
    "STEPS_SUFFIX",
    "StepBuffer",
    "read_records",
    "records_to_events",
    "step_end_event",
    "steps_path",
    "write_all",
]

STEPS_SUFFIX = ".steps"
RECORD = struct.Struct("<qddddd")  # step, start, end, fetch, loss, wall
# The file's first bytes name the format (one record long, so records stay aligned).
HEADER = b"goodput-ledger-steps-v1\n".ljust(RECORD.size, b"\n")
_FIELDS = ("step", "start", "end", "fetch", "loss", "wall")
_NAN = float("nan")


def steps_path(jsonl: Path) -> Path:
    """The step-record file beside an attempt's JSONL file."""
    return jsonl.with_suffix(STEPS_SUFFIX)


class StepBuffer:
    """One attempt's step records not yet written, and the step open now (internal to ``goodput.Ledger``,
    whose lock its callers hold; :meth:`write` runs under the ledger's write lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: list[bytes] = []
        self._open: tuple[int, float, float] | None = None  # step, start (monotonic), wall at the start
        self._open_queued = False
        self._fd = -1
        self.last = b""  # the record of the step that ended last (every step ends here: no copy, no I/O)

    def start(self, step: int, mono: float, wall: float) -> None:
        self._queue_open()  # a step that began and never ended (a shrink interrupted it)
        self._open, self._open_queued = (step, mono, wall), False

    def end(self, step: int, mono: float, fetch: float, loss: float, wall: float) -> None:
        start = _NAN if self._open is None else self._open[1]
        self.last = RECORD.pack(step, start, mono, fetch, loss, wall)
        self._pending.append(self.last)
        self._open = None

    def _queue_open(self) -> None:
        if self._open is not None and not self._open_queued:
            step, start, wall = self._open
            self._pending.append(RECORD.pack(step, start, _NAN, 0.0, _NAN, wall))
            self._open_queued = True

    def take(self) -> bytes:
        """Everything queued, the open step's record included (a kill before it ends still shows it began)."""
        self._queue_open()
        data, self._pending = b"".join(self._pending), []
        return data

    def write(self, data: bytes, *, fsync: bool) -> None:
        if not data:
            return
        if self._fd < 0:
            self._fd = _open_for_append(self.path)
        write_all(self._fd, data, fsync=fsync)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_all(fd: int, data: bytes, *, fsync: bool) -> None:
    """Append ``data`` to ``fd`` whole (``os.write`` may write part), then fsync if asked."""
    while data:
        data = data[os.write(fd, data) :]
    if fsync:
        os.fsync(fd)


def _open_for_append(path: Path) -> int:
    """Created with its header, or an existing file (an attempt opened again) cut back to its last whole record."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    size = os.fstat(fd).st_size
    if size < len(HEADER):
        os.ftruncate(fd, 0)
        os.write(fd, HEADER)
    elif (size - len(HEADER)) % RECORD.size:
        os.ftruncate(fd, size - (size - len(HEADER)) % RECORD.size)
    return fd


def read_records(path: Path, *, tail: bool = False) -> np.ndarray:
    """The step records of one file as a structured array (fields ``step``, ``start``, ``end``, ``fetch``,
    ``loss``, ``wall``), open records superseded by their step's end removed; empty when there is no file.

    Args:
        path: the ``.steps`` file.
        tail: read only the last full record (a rank whose steps the report does not count).
    """
    import numpy as np  # here, not at import: the writer (every worker, the launcher's tools) needs no numpy

    dtype = np.dtype([(name, "<i8" if name == "step" else "<f8") for name in _FIELDS])
    try:
        with open(path, "rb") as f:
            head = f.read(len(HEADER))
            if head != HEADER:
                if head:
                    warnings.warn(f"ledger {path}: not a step-record file, ignored", stacklevel=3)
                return np.empty(0, dtype)
            size = f.seek(0, 2)
            count = (size - len(HEADER)) // RECORD.size
            if size - len(HEADER) - count * RECORD.size:
                warnings.warn(
                    f"ledger {path}: ignored a torn last step record (the process was probably killed "
                    "mid-write)",
                    stacklevel=3,
                )
            first = max(0, count - 64) if tail else 0
            f.seek(len(HEADER) + first * RECORD.size)
            records = np.frombuffer(f.read((count - first) * RECORD.size), dtype)
    except FileNotFoundError:
        return np.empty(0, dtype)
    if tail:
        done = records[~np.isnan(records["end"])]
        if len(done) or not first:
            return done[-1:]
        records = read_records(path)  # the last 64 records are all open: look further back
        return records[~np.isnan(records["end"])][-1:]
    return _without_superseded(records)


def last_step_end(path: str, attempt: int, rank: int) -> dict[str, Any] | None:
    """The ``step_end`` event of the file's last ended step (None without one): what the report reads of a
    rank whose steps it does not count, without numpy and with one read (it does so once per file of a long
    run)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        whole = (os.fstat(fd).st_size - len(HEADER)) // RECORD.size
        first = max(0, whole - 64)
        data = os.pread(fd, max(0, whole - first) * RECORD.size, len(HEADER) + first * RECORD.size)
    finally:
        os.close(fd)
    for i in range(len(data) // RECORD.size - 1, -1, -1):
        record = RECORD.unpack_from(data, i * RECORD.size)
        if record[2] == record[2]:  # not NaN: ended
            return step_end_event(record, attempt, rank)
    if first:  # the last 64 records are all open: look further back
        ended = read_records(Path(path), tail=True)
        return records_to_events(ended, attempt, rank)[-1] if len(ended) else None
    return None


def step_end_event(record: tuple[Any, ...], attempt: int, rank: int) -> dict[str, Any]:
    """The ``step_end`` event of an ended record (its fields unpacked)."""
    step, _, end, fetch, loss, wall = record
    event = {"event": "step_end", "wall": wall, "mono": end, "attempt": attempt, "rank": rank, "step": step,
             "fetch_seconds": fetch}  # fmt: skip
    if loss == loss:
        event["loss"] = loss
    return event


def _without_superseded(records: np.ndarray) -> np.ndarray:
    is_open = records["end"] != records["end"]  # NaN
    if not is_open.any():
        return records
    ended = {(int(r["step"]), float(r["start"])) for r in records[~is_open]}
    keep = ~is_open
    for i in is_open.nonzero()[0]:
        key = (int(records[i]["step"]), float(records[i]["start"]))
        keep[i] = key not in ended
        ended.add(key)  # an open step written twice (two flushes) counts once
    return records[keep]


def records_to_events(records: np.ndarray, attempt: int, rank: int) -> list[dict[str, Any]]:
    """The ``step_start``/``step_end`` events the records stand for, in time order (as the JSONL held them)."""
    events: list[dict[str, Any]] = []
    for step, start, end, fetch, loss, wall in records.tolist():
        ended = end == end  # NaN: open
        if start == start:
            began_wall = wall - (end - start) if ended else wall
            events.append(
                {"event": "step_start", "wall": began_wall, "mono": start, "attempt": attempt, "rank": rank,
                 "step": step}
            )  # fmt: skip
        if ended:
            event = {"event": "step_end", "wall": wall, "mono": end, "attempt": attempt, "rank": rank,
                     "step": step, "fetch_seconds": fetch}  # fmt: skip
            if loss == loss:
                event["loss"] = loss
            events.append(event)
    return events
