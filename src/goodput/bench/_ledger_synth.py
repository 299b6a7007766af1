"""A long run's ledger, synthesized: the files ``goodput.Ledger`` would write for a job of ``ranks`` ranks over
``attempts`` attempts and ``steps`` steps per rank (``goodput bench ledger --report-steps``).

Each attempt of each rank writes what ``goodput.Run`` records: ``attempt_start`` (its process start 40 s
earlier), ``init_done``, ``restore_start``/``restore_end`` (the step the previous attempt last made durable),
a ``step_start``/``step_end`` pair per step (0.25 s each, 1 ms of it fetching; the same compact lines the
ledger writes), a checkpoint every ``every`` steps (stall start and end, durable), and at its end
``failure_detected`` + ``attempt_end`` "failed" (the last attempt: ``attempt_end`` "ok"). Attempts are 60 s
apart. 10^7 steps of 0.25 s are 29 days of training.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["STEP_SECONDS", "synthesize"]

STEP_SECONDS = 0.25
_INIT = 30.0
_RESTORE = 10.0
_GAP = 60.0


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"  # the ledger's own encoder: default separators


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
) -> tuple[list[str], float, int]:
    """One attempt of one rank: its lines, its end time and the newest step it made durable."""
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
    durable = restored
    for step in range(first, first + count):
        out.append(f'{{"event":"step_start","wall":{mono + offset!r},"mono":{mono!r}{ids},"step":{step}}}\n')
        mono += STEP_SECONDS
        out.append(
            f'{{"event":"step_end","wall":{mono + offset!r},"mono":{mono!r}{ids},"step":{step},'
            f'"fetch_seconds":0.001,"loss":2.5}}\n'
        )
        if step % every == 0:
            for name, dt in (("checkpoint_stall_start", 0.0), ("checkpoint_stall_end", 0.1)):
                mono += dt
                out.append(_line({"event": name, "wall": mono + offset, "mono": mono, **head, "step": step}))
            out.append(_line({"event": "checkpoint_durable", "wall": mono + 5 + offset, "mono": mono + 5, **head,
                              "step": step, "persist_seconds": 5.0}))  # fmt: skip
            durable = step
    mono += 5.0
    if not last:
        out.append(_line({"event": "failure_detected", "wall": mono + offset, "mono": mono, **head,
                          "reason": "synthesized failure"}))  # fmt: skip
    out.append(_line({"event": "attempt_end", "wall": mono + offset, "mono": mono, **head,
                      "status": "ok" if last else "failed"}))  # fmt: skip
    return out, mono + offset, durable


def synthesize(
    run_dir: str, *, steps: int, attempts: int, ranks: int, every: int = 100, start: float = 1.8e9
) -> dict[str, int]:
    """Write the ledger of such a run under ``run_dir``; returns its counts (files, events, step events,
    failures, bytes). ``steps`` are per rank, redone ones included, spread evenly over the attempts."""
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
        for rank in range(ranks):
            lines, end_r, durable = _attempt_lines(
                attempt, rank, ranks, restored + 1, count, restored, every, t0, attempt == attempts
            )
            data = "".join(lines).encode()
            with open(os.path.join(folder, f"attempt-{attempt:04d}.rank-{rank:05d}.jsonl"), "wb") as f:
                f.write(data)
            counts["files"] += 1
            counts["events"] += len(lines)
            counts["step_events"] += 2 * count
            counts["bytes"] += len(data)
            end = max(end, end_r)
        restored, t0 = durable, end + _GAP
    return counts
