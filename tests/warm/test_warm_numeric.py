"""Every rank of a warm generation judges a step from the same memory: real processes (gloo on CPU).

Rank 1 is SIGKILLed at step 30 and a hot spare takes its place; at step 33 every rank's loss is spiked 50x. The
spare has no loss history of its own, so its spike rule would be warming up while the survivor judges the step
from 30 steps of losses and calls a spike: one rank rolling back while the other trains on hangs the job. Both
must call it a spike and roll back, and the job must complete.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from typing import Any

import pytest

from tests.helpers.launching import SCRIPTS, warm_launch

SCRIPT = os.path.join(SCRIPTS, "dropout_warm_train.py")


@pytest.mark.slow
def test_after_a_warm_restart_the_survivor_and_the_spare_call_a_spike_alike(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    faults = "kill@step=30,rank=1;spike@step=33,factor=50"
    cmd = [*warm_launch(run_dir), "--faults", faults, "--", SCRIPT, "--steps", "40", "--numeric"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warm hand-over to spare" in proc.stderr, proc.stderr[-3000:]
    verdicts: dict[int, list[str]] = {}
    for path in glob.glob(os.path.join(run_dir, "ledger", "attempt-*.rank-*.jsonl")):
        with open(path) as f:
            for e in map(json.loads, f):
                if e["event"] == "spike_missed" and e["step"] == 33:
                    verdicts.setdefault(e["rank"], []).append(e["why"])
                elif e["event"] == "numeric_fault":
                    verdicts.setdefault(e["rank"], []).append(f"fault: {e['kind']} at {e['step']}")
    assert sorted(verdicts) == [0, 1], verdicts
    assert verdicts[0] == verdicts[1] == ["fault: spike at 33"], verdicts  # the same verdict on both ranks


@pytest.mark.slow
def test_a_rollback_that_meets_a_failed_save_in_flight_restores_what_is_committed_and_trains_on(
    tmp_path: Any,
) -> None:
    """The asynchronous save of step 10 fails in its upload (as a full store refuses it); the NaN at step 11 is
    found at step 12, before the next save, so the rollback meets that failed save still in flight. The failure
    was logged where it happened: the rollback restores the newest committed step and the job trains on, with no
    restart (as a NaN inside a full store's window must)."""
    run_dir = str(tmp_path / "run")
    faults = "raise@phase=async_upload,step=10;nan@step=11,rank=1"
    cmd = [*warm_launch(run_dir), "--faults", faults, "--", SCRIPT, "--steps", "16", "--numeric"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = os.path.join(run_dir, "warm", "agent.jsonl")  # the agent's restarts, when it had any
    agent = [json.loads(line)["event"] for line in open(log)] if os.path.exists(log) else []  # noqa: SIM115
    assert "warm_restart" not in agent and "cold_restart" not in agent, agent
    events = []
    for path in glob.glob(os.path.join(run_dir, "ledger", "attempt-*.rank-00000.jsonl")):
        with open(path) as f:
            events += [e for e in map(json.loads, f) if e["event"] in ("rollback", "checkpoint_failed")]
    assert [e["step"] for e in events if e["event"] == "checkpoint_failed"] == [10], events
    rollbacks = [(e["from_step"], e["to_step"]) for e in events if e["event"] == "rollback"]
    assert rollbacks == [(11, 8)], events  # step 10's save never committed: back to step 8
