"""Real processes, real SIGKILL: a run of three attempts whose ledger accounts for itself.

Each attempt is a child process that restores the last committed step from a JSON "checkpoint", runs 20 ms
steps, and commits a checkpoint every 10 steps. The test kills the first two attempts with SIGKILL as soon as
they report steps 25 and 47, and lets the third finish. The redone work is measured independently of the
accounting: the durations of every step execution whose step number runs again in a later attempt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from goodput import account, build_report, load_report, read_events
from goodput.ledger.files import read_ledger

_ATTEMPT = """
import json, os, sys, time
from goodput.ledger import Ledger, LedgerConfig
run = sys.argv[1]
ledger = Ledger(run, rank=0, config=LedgerConfig(flush_seconds=0.05, fsync=False))
ckpt = os.path.join(run, "ckpt.json")
ledger.restore_start()
step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
ledger.restore_end(step or None)
ledger.init_done()
while step < 60:
    step += 1
    ledger.step_start(step)
    began = time.perf_counter()
    while time.perf_counter() - began < 0.02:  # the step's work
        pass
    ledger.step_end(step, fetch_seconds=0.002)
    print("step", step, flush=True)
    if step % 10 == 0:
        ledger.on_event("checkpoint_stall", phase="start", step=step)
        with open(ckpt + ".tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace(ckpt + ".tmp", ckpt)
        ledger.on_event("checkpoint_stall", phase="end", step=step)
        ledger.on_event("checkpoint_durable", step=step)
ledger.close()
"""


def _attempt(run: Path, kill_after: int | None) -> None:
    env = {**os.environ, "GOODPUT_LAUNCH_ID": "one-launch"}  # restarts within one launch, as goodput launch's
    child = subprocess.Popen(
        [sys.executable, "-c", _ATTEMPT, str(run)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if kill_after is not None and line.strip() == f"step {kill_after}":
                os.kill(child.pid, signal.SIGKILL)
                break
        assert child.wait(timeout=60) == (0 if kill_after is None else -signal.SIGKILL)
    finally:
        child.kill()
        child.wait()


def _redone_seconds(events: list[dict[str, Any]]) -> float:
    """Step executions (step_start to step_end, minus fetch) whose step number runs again later."""
    runs: list[tuple[int, int, float]] = []  # attempt, step, compute seconds
    starts: dict[tuple[int, int], float] = {}
    for e in events:
        key = (e["attempt"], e.get("step", -1))
        if e["event"] == "step_start":
            starts[key] = e["mono"]
        elif e["event"] == "step_end" and key in starts:
            runs.append((key[0], key[1], e["mono"] - starts[key] - e["fetch_seconds"]))
    return sum(sec for a, s, sec in runs if any(a2 > a and s2 == s for a2, s2, _ in runs))


def test_sigkilled_attempts_account_for_every_second(tmp_path: Path) -> None:
    for kill_after in (25, 47, None):
        _attempt(tmp_path, kill_after)
    events = read_events(tmp_path)
    acc = account(events)
    assert [a.outcome for a in acc.attempts] == ["failed", "failed", "ok"]
    assert [a.restored_step for a in acc.attempts] == [None, 20, 40]
    assert acc.restarts == 2 and acc.failures == 2
    assert sum(acc.categories.values()) == pytest.approx(acc.wall_seconds, rel=1e-9)
    redone = _redone_seconds(events)
    assert redone > 5 * 0.02  # steps 21-25 at least were redone
    # warm-up steps count their excess apart; all the rest of a redone step is lost work
    assert acc.categories["lost_work"] + acc.categories["warmup"] >= redone - 1e-6
    assert acc.categories["lost_work"] == pytest.approx(redone, abs=0.05)
    assert acc.categories["restart_downtime"] > 0 and acc.categories["init"] > 0
    assert acc.categories["data_wait"] == pytest.approx(0.002 * acc.step_stats.count, rel=1e-6)


def _close(a: Any, b: Any) -> bool:
    """Equal, floats to within summation order (relative 1e-9)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-9)
    return bool(a == b)


def test_the_report_from_step_records_is_the_one_from_every_step_event(tmp_path: Path) -> None:
    """A real run with two SIGKILLed attempts: the report read as the CLI reads it (the primary rank's step
    records as arrays) is the report of every step as an event; tiled in chunks (as a run of more than
    EXACT_STEPS steps is) every figure it prints is the same."""
    for kill_after in (25, 47, None):
        _attempt(tmp_path, kill_after)
    full = build_report(read_events(tmp_path, rank=None), run_dir=str(tmp_path))
    fast = load_report(tmp_path)
    assert fast.to_dict() == full.to_dict()
    assert fast.accounting.segments == full.accounting.segments
    assert fast.render() == full.render()
    assert [a.outcome for a in fast.accounting.attempts] == ["failed", "failed", "ok"]
    events, records = read_ledger(tmp_path, primary=0)
    assert sorted(records) == [(0, 0), (1, 0), (2, 0)] and not any(
        e["event"].startswith("step_") for e in events
    )
    chunked = account(events, records=records, exact_steps=0)
    assert len(chunked.segments) < len(full.accounting.segments) * 3 / 4
    assert _close(chunked.to_dict(), full.accounting.to_dict())
    assert [seg.start for seg in chunked.segments] == sorted(seg.start for seg in chunked.segments)
    assert all(seg.end > seg.start for seg in chunked.segments)


_KILLED_AFTER_RESTORE = """
import os, signal, sys
from goodput.ledger import Ledger, LedgerConfig
ledger = Ledger(sys.argv[1], rank=0, config=LedgerConfig(flush_seconds=60))
ledger.restore_start()
ledger.restore_end(7)
ledger.step_start(8)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_sigkill_right_after_a_restore_keeps_the_restored_step(tmp_path: Path) -> None:
    """The step an attempt resumed from is written through: a kill long before the next flush keeps it (the
    step after it, buffered, may go)."""
    proc = subprocess.run([sys.executable, "-c", _KILLED_AFTER_RESTORE, str(tmp_path)], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    events = read_events(tmp_path)
    assert [e["step"] for e in events if e["event"] == "restore_end"] == [7]
    assert "step_start" not in {e["event"] for e in events}
