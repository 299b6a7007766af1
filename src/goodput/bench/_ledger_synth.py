"""A long run's ledger, synthesized: the files ``goodput.Ledger`` would write for a job of ``ranks`` ranks over
``attempts`` attempts and ``steps`` steps per rank (``goodput bench ledger --report-steps``).

Each attempt of each rank writes what ``goodput.Run`` records: ``attempt_start`` (its process start 40 s
earlier), ``init_done``, ``restore_start``/``restore_end`` (the step the previous attempt last made durable),
a step every 0.25 s (1 ms of it fetching), a checkpoint every ``every`` steps (stall start and end, durable),
and at its end ``failure_detected`` + ``attempt_end`` "failed" (the last attempt: ``attempt_end`` "ok").
Attempts are 60 s apart. 10^7 steps of 0.25 s are 29 days of training.

The steps are written as the ledger writes them now, one record each in the attempt's ``.steps`` file
(:mod:`goodput.ledger.steps`), or with ``json_steps`` as a ledger of the older format held them, a
``step_start``/``step_end`` JSON line pair each. With ``sparse`` the ranks above 0 get step files of their full
size whose only bytes written are the header and the last records (the rest is a hole reading as zeros): the
report reads no more of another rank's steps than its last, and a 64-rank, 10^7-step ledger would otherwise be
30 GB.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from goodput.ledger.index import NOT_INDEXED, end_line, index_path
from goodput.ledger.steps import HEADER, RECORD

__all__ = ["STEP_SECONDS", "synthesize"]

STEP_SECONDS = 0.25
_INIT = 30.0
_RESTORE = 10.0
_GAP = 60.0


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"  # the ledger's own encoder: default separators


def _step_times(mono: float, first: int, count: int, every: int) -> tuple[np.ndarray, np.ndarray]:
    """Each step's start and end (monotonic): 0.25 s steps, 0.1 s more after each checkpoint's step."""
    steps = np.arange(first, first + count)
    increments = np.full(count, STEP_SECONDS)
    increments[1:] += np.where(steps[:-1] % every == 0, 0.1, 0.0)  # the stall after the previous step
    starts = mono + np.cumsum(increments) - STEP_SECONDS
    return starts, starts + STEP_SECONDS


def _attempt_lines(
    attempt: int,
    rank: int,
    ranks: int,
    first: int,
    count: int,
    restored: int,
    every: int,
    t0: float,
    last: bool,
    json_steps: bool,
    keep: int,
) -> tuple[list[str], np.ndarray, float, int]:
    """One attempt of one rank: its JSON lines, the records of its last ``keep`` steps, its end time and the
    newest step it made durable."""
    ids = f',"attempt":{attempt},"rank":{rank}'
    head = {"attempt": attempt, "rank": rank}
    wall = t0 + 40.0 + rank * 1e-3
    mono = 1000.0 + attempt * 1e5 + rank
    offset = wall - mono
    out = [
        _line({"event": "attempt_start", "wall": wall, "mono": mono, **head, "process_start": t0, "pid": 1000 + rank,
               "host": f"node{rank // 8}", "world_size": ranks, "restart_count": attempt - 1, "launch": "synth"}),
    ]  # fmt: skip
    for name, dt in (("init_done", _INIT), ("restore_start", 0.0), ("restore_end", _RESTORE)):
        mono += dt
        record: dict[str, Any] = {"event": name, "wall": mono + offset, "mono": mono, **head}
        if name == "restore_end":
            record["step"] = restored or None
        out.append(_line(record))
    starts, ends = _step_times(mono, first, count, every)
    kept = slice(count - min(keep, count), count)
    records = np.zeros(kept.stop - kept.start, dtype=_DTYPE)
    records["step"] = np.arange(first + kept.start, first + count)
    records["start"], records["end"], records["fetch"], records["loss"] = starts[kept], ends[kept], 0.001, 2.5
    records["wall"] = ends[kept] + offset
    saved_steps = np.arange(-(-first // every) * every, first + count, every)
    saved = list(zip(saved_steps.tolist(), ends[saved_steps - first].tolist(), strict=True))
    saves = iter(saved)
    pending = next(saves, None)
    if json_steps:  # the older format: a JSON line pair per step, the saves' lines among them
        for step, start, end in zip(range(first, first + count), starts.tolist(), ends.tolist(), strict=True):
            out.append(
                f'{{"event":"step_start","wall":{start + offset!r},"mono":{start!r}{ids},"step":{step}}}\n'
            )
            out.append(f'{{"event":"step_end","wall":{end + offset!r},"mono":{end!r}{ids},"step":{step},'
                       '"fetch_seconds":0.001,"loss":2.5}\n')  # fmt: skip
            if pending is not None and pending[0] == step:
                out.extend(_save_lines(head, offset, *pending))
                pending = next(saves, None)
    else:
        for step, end in saved:
            out.extend(_save_lines(head, offset, step, end))
    durable = saved[-1][0] if saved else restored
    mono = float(ends[-1]) + (0.1 if saved and saved[-1][0] == first + count - 1 else 0.0) + 5.0
    if not last:
        out.append(_line({"event": "failure_detected", "wall": mono + offset, "mono": mono, **head,
                          "reason": "synthesized failure"}))  # fmt: skip
    out.append(_line({"event": "attempt_end", "wall": mono + offset, "mono": mono, **head,
                      "status": "ok" if last else "failed"}))  # fmt: skip
    return out, records, mono + offset, durable


_DTYPE = np.dtype(
    [("step", "<i8"), ("start", "<f8"), ("end", "<f8"), ("fetch", "<f8"), ("loss", "<f8"), ("wall", "<f8")]
)
assert _DTYPE.itemsize == RECORD.size


def _save_lines(head: dict[str, Any], offset: float, step: int, end: float) -> list[str]:
    """A checkpoint after ``step`` (which ended at ``end``): a 0.1 s stall, durable 5 s later."""
    return [
        _line({"event": "checkpoint_stall_start", "wall": end + offset, "mono": end, **head, "step": step}),
        _line({"event": "checkpoint_stall_end", "wall": end + 0.1 + offset, "mono": end + 0.1, **head, "step": step}),
        _line({"event": "checkpoint_durable", "wall": end + 5.1 + offset, "mono": end + 5.1, **head, "step": step,
               "persist_seconds": 5.0}),
    ]  # fmt: skip


def _write_records(path: str, records: np.ndarray, count: int) -> int:
    """The step file of ``count`` steps, of which ``records`` are the last (the rest left a hole); returns
    its size."""
    with open(path, "wb") as f:
        f.write(HEADER)
        f.seek(len(HEADER) + (count - len(records)) * RECORD.size)
        f.write(records.tobytes())
        return f.tell()


def _index_lines(lines: list[str], records: np.ndarray, attempt: int, rank: int) -> list[bytes]:
    """What the rank's writer appends to the attempt's index (:mod:`goodput.ledger.index`)."""
    job = [line.encode() for line in lines if json.loads(line)["event"] not in NOT_INDEXED]
    return [*job, end_line(rank, attempt, records[-1:].tobytes(), lines=len(job))]


def synthesize(
    run_dir: str,
    *,
    steps: int,
    attempts: int,
    ranks: int,
    every: int = 100,
    start: float = 1.8e9,
    json_steps: bool = False,
    sparse: bool = False,
) -> dict[str, int]:
    """Write the ledger of such a run under ``run_dir``; returns its counts (files, events, step events,
    failures, bytes: their size on disk, holes left out). ``steps`` are per rank, redone ones included, spread
    evenly over the attempts; the events count a step as its two events, in either format."""
    if steps < attempts or attempts < 1 or ranks < 1 or every < 1:
        raise ValueError(
            f"need steps >= attempts >= 1, ranks >= 1 and every >= 1; got {steps}, {attempts}, {ranks}"
        )
    folder = os.path.join(run_dir, "ledger")
    os.makedirs(folder, exist_ok=True)
    counts = {"files": 0, "events": 0, "step_events": 0, "failures": attempts - 1, "bytes": 0}
    restored, t0 = 0, start
    for attempt in range(1, attempts + 1):
        count = steps // attempts + (steps % attempts if attempt == attempts else 0)
        end, durable = t0, restored
        index: list[bytes] = []
        for rank in range(ranks):
            lines, records, end_r, durable = _attempt_lines(
                attempt,
                rank,
                ranks,
                restored + 1,
                count,
                restored,
                every,
                t0,
                attempt == attempts,
                json_steps,
                64 if sparse and rank > 0 else count,
            )
            data = "".join(lines).encode()
            name = os.path.join(folder, f"attempt-{attempt:04d}.rank-{rank:05d}")
            with open(name + ".jsonl", "wb") as f:
                f.write(data)
            counts["files"] += 1
            counts["events"] += len(lines) + (0 if json_steps else 2 * count)
            counts["step_events"] += 2 * count
            counts["bytes"] += len(data)
            if not json_steps:
                hole = sparse and rank > 0
                size = _write_records(name + ".steps", records, count)
                counts["bytes"] += size if not hole else len(HEADER) + min(64, count) * RECORD.size
                index.extend(_index_lines(lines, records, attempt, rank))
            end = max(end, end_r)
        if index:  # as every rank's writer appends to it (the older format had none)
            with open(index_path(Path(folder), attempt), "wb") as f:
                counts["bytes"] += f.write(b"".join(index))
        restored, t0 = durable, end + _GAP
    return counts
