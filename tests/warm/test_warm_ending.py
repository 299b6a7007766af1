"""A rank that ends well (exit 0) while a peer's failure is being answered, under real processes (gloo on CPU).

Rank 0 is SIGKILLed right after the job's last checkpoint committed (in its retention thread, which only rank 0
runs), while rank 1 closes its run and exits 0. Whichever the agent sees first, nothing is left to recover: the
job ends with exit 0 once rank 1 has closed, without the cold restart (or the 30 s re-form timeout before it)
that a rank which could never join the pending generation used to cost. A rank that ends well before the job's last step instead makes
the job restart cold at once, and the job then completes.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from goodput.checkpoint import list_checkpoints
from tests.helpers.launching import warm_launch
from tests.warm.test_warm import SCRIPT

REFORM_TIMEOUT = 30.0  # the agent's default (WarmConfig.reform_timeout)


def _launch(run_dir: str, faults: str, *script_args: str, env: dict[str, str] | None = None) -> None:
    cmd = [*warm_launch(run_dir), "--faults", faults, "--collective-timeout", "4", "--", SCRIPT]
    cmd += ["--steps", "40", "--step-seconds", "0.01", *script_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]


def _agent(run_dir: str) -> list[dict[str, Any]]:
    with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
        return [json.loads(line) for line in f]


def _newest_committed(run_dir: str) -> int:
    rows = list_checkpoints(os.path.join(run_dir, "checkpoints"))
    return max(r.step for r in rows if r.status == "committed")


@pytest.mark.slow
def test_a_rank_killed_after_the_last_checkpoint_committed_ends_the_job_at_once(tmp_path: Any) -> None:
    run_dir = str(tmp_path)
    # keep_last=2 and a save every 10 steps: step 40's commit purges step 20, so rank 0 dies after it committed
    _launch(run_dir, "kill@phase=checkpoint_purge,step=40,rank=0", "--every", "10")
    events = _agent(run_dir)
    kinds = [e["event"] for e in events]
    # rank 0's death first (its restart pending, rank 1 then exits 0) or rank 1's exit first: no restart runs
    assert kinds in (["warm_restart", "job_complete"], ["job_complete"]), events
    done = events[-1]
    assert (done["rank"], done["step"], done["failed"]) == (1, 40, [] if len(kinds) == 2 else [0]), done
    if len(kinds) == 2:  # the pending restart was dropped once rank 1 ended, not at the re-form timeout
        assert done["pending"] == events[0]["gen"] and done["stopped"] == [0], done  # the replacement
        assert done["wall"] - events[0]["wall"] < REFORM_TIMEOUT, events
    else:  # nothing pending: rank 1, still closing its run, was left to end on its own
        assert done["pending"] is None and done["stopped"] == [], done
    assert _newest_committed(run_dir) == 40
    # rank 1 closed its run (not stopped as it ended): its attempt ended "ok" in the ledger
    with open(os.path.join(run_dir, "ledger", "attempt-0000.rank-00001.jsonl")) as f:
        ends = [e["status"] for e in map(json.loads, f) if e["event"] == "attempt_end"]
    assert ends == ["ok"], ends


@pytest.mark.slow
def test_a_rank_that_ends_before_the_last_step_makes_the_job_restart_cold_at_once(tmp_path: Any) -> None:
    run_dir = str(tmp_path)
    # every rank stops after step 20 (verify-resume's GOODPUT_STOP_AFTER) and exits 0, a job not complete; rank 0
    # dies after step 20's commit (saves every 5 steps, keep_last=2: the commit purges step 10)
    _launch(
        run_dir,
        "kill@phase=checkpoint_purge,step=20,rank=0",
        "--every",
        "5",
        env={"GOODPUT_STOP_AFTER": "20"},
    )
    events = _agent(run_dir)
    cold = [e for e in events if e["event"] == "cold_restart"]
    assert len(cold) == 1 and "not recovered" not in cold[0]["reason"], events
    assert "job_complete" not in [e["event"] for e in events]
    pending = [e for e in events if e["event"] == "warm_restart"]
    if pending:  # rank 0's death first: rank 1's exit ends the pending restart at once, not at the timeout
        assert "ended (exit 0) before the job's last step" in cold[0]["reason"], cold
        assert cold[0]["wall"] - pending[0]["wall"] < REFORM_TIMEOUT, events
    # the cold generation trained the rest: its newest checkpoint is the last step
    assert _newest_committed(run_dir) == 40
