"""A warm restart right after a cold one resumes the data exactly, with real processes and SIGKILL.

Under ``goodput launch --restart warm`` a failure during a warm hand-over makes the agent restart the group
cold; the new processes restore a checkpoint. When a rank of that cold generation then dies before any step
completes, the survivor hands on the restored step: it must hand on the loader's position with it, or every
rank's new loader starts the data again (samples trained twice, others never).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import goodput.bench

SCRIPT = os.path.join(os.path.dirname(goodput.bench.__file__), "_restart_train.py")


def _last_trained(run_dir: str, rank: int) -> dict[int, list[int]]:
    """Each step's samples on ``rank``, as the last process that trained the step logged them."""
    steps: dict[int, list[int]] = {}
    for line in Path(run_dir, "samples", f"rank-{rank}.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = record["samples"]
    return steps


def _agent_events(run_dir: str) -> list[str]:
    lines = Path(run_dir, "warm", "agent.jsonl").read_text().splitlines()
    return [json.loads(line)["event"] for line in lines]


@pytest.mark.slow
def test_a_warm_restart_before_the_first_step_of_a_cold_generation_trains_every_sample_once(
    tmp_path: Path,
) -> None:
    """Rank 1 dies at step 12 (warm); rank 0 dies inside that hand-over (cold: both restore step 10); rank 0
    dies again right after loading step 10 (warm, the survivor holding step 10 and no completed step)."""
    run_dir = str(tmp_path / "run")
    faults = "kill@step=12,rank=1; kill@phase=restore,rank=0,attempt=1; kill@phase=restore,rank=0,attempt=2"
    steps = 20
    launch = ["--restart", "warm", "--nproc", "2", "--run-dir", run_dir, "--collective-timeout", "4"]
    launch += ["--max-restarts", "10", "--faults", faults]
    args = [*launch, "--", SCRIPT, "--steps", str(steps), "--every", "10", "--hidden", "16"]
    proc = subprocess.run(
        [sys.executable, "-m", "goodput", "launch", *args], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = _agent_events(run_dir)
    assert events.count("cold_restart") == 1 and events.index("cold_restart") < len(events) - 1, events
    assert events[events.index("cold_restart") + 1] == "warm_restart", events  # the warm one after the cold
    seen: list[int] = []
    for rank in (0, 1):
        trained = _last_trained(run_dir, rank)
        assert sorted(trained) == list(range(1, steps + 1))
        seen += [sample for step in sorted(trained) for sample in trained[step]]
    assert len(seen) == len(set(seen)) == steps * 2 * 8, "a sample trained twice (and so another never)"
