"""``goodput demo --spares 0``: no spare, so the demo shrinks in place and grows back; its global batch splits
over every world size it may train on, and its report shows capacity goodput and that every sample was trained
exactly once (from the ranks' sample logs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from goodput.demo.main import TRAIN_SCRIPT, shrink_global_batch
from goodput.demo.verify_train import prepare_data
from goodput.errors import ConfigError
from goodput.verify.demo import global_steps, step_epochs, trained_twice


def test_the_demo_global_batch_splits_over_every_world_size_it_may_shrink_to() -> None:
    for per_rank, nproc in ((16, 2), (16, 3), (16, 4), (5, 6), (1, 1)):
        batch = shrink_global_batch(per_rank, nproc)
        assert batch >= per_rank * nproc
        assert all(batch % w == 0 for w in range(1, nproc + 1)), (per_rank, nproc, batch)
    assert (shrink_global_batch(16, 2), shrink_global_batch(16, 4), shrink_global_batch(16, 4, 3)) == (
        32,
        72,
        72,
    )
    with pytest.raises(ConfigError):
        shrink_global_batch(16, 2, 3)


def _line(step: int, attempt: int, samples: list[int]) -> str:
    return json.dumps({"step": step, "attempt": attempt, "samples": samples})


def test_a_step_counts_the_samples_of_the_last_attempt_that_trained_it_on_any_world_size() -> None:
    """2 ranks train steps 1-2; rank 1 logs step 3 and dies before rank 0 does; rank 0 alone trains step 3
    again (attempt 1, the whole global batch) and step 4; then a rollback redoes step 4 in the same attempt."""
    rank0 = [_line(1, 0, [0, 1]), _line(2, 0, [4, 5]), _line(3, 1, [8, 9, 10, 11]), _line(4, 1, [0, 0, 0, 0])]
    rank0 += [_line(4, 1, [12, 13, 14, 15]), '{"step": 5, "att']  # a torn last line
    rank1 = [_line(1, 0, [2, 3]), _line(2, 0, [6, 7]), _line(3, 0, [20, 21])]
    steps = global_steps([rank0, rank1])
    assert steps == {1: [0, 1, 2, 3], 2: [4, 5, 6, 7], 3: [8, 9, 10, 11], 4: [12, 13, 14, 15]}
    assert trained_twice(steps) == []
    assert trained_twice({1: [0, 1], 2: [1, 2], 3: [3, 3]}) == [1, 3]


@pytest.mark.slow
def test_the_demo_with_no_spare_shrinks_grows_back_and_trains_every_sample_once(tmp_path: str) -> None:
    run_dir = os.path.join(tmp_path, "demo")
    command = [
        sys.executable,
        "-m",
        "goodput",
        "demo",
        "--run-dir",
        run_dir,
        "--spares",
        "0",
        "--steps",
        "120",
    ]
    # Seed 255 draws the first SIGKILL 6.5 s into the first attempt and none in the next three within the run (the
    # schedule is drawn per attempt from (seed, attempt)): the job shrinks, then grows back once the replacement
    # has imported torch.
    command += ["--mtbf", "20s", "--seed", "255", "--strategy", "torch_save"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the global batch of 32 is kept" in proc.stdout
    with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
        events = [json.loads(line)["event"] for line in f]
    assert events[0] == "shrink" and "grow" in events and "cold_restart" not in events, events
    assert "capacity goodput (measured)" in proc.stdout, proc.stdout[-3000:]
    line = "samples: 3840 over 120 steps, 32 a step; 0 trained twice, 0 steps never trained"
    assert line in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_a_rank_killed_after_its_gradients_are_summed_leaves_its_samples_in_the_log(tmp_path: str) -> None:
    """Rank 1 is SIGKILLed right after its optimizer step of step 6, before its step is done: rank 0 completes
    step 6 with rank 1's gradients in it and trains on alone from there. The logs must hold rank 1's samples of
    step 6 (they are learned), so every step counts its whole global batch, and no sample is counted twice."""
    data = prepare_data(str(tmp_path))
    run_dir = os.path.join(tmp_path, "run")
    command = [sys.executable, "-m", "goodput", "launch", "--nproc", "2", "--run-dir", run_dir]
    command += ["--restart", "warm", "--spares", "0", "--shrink-after", "0"]
    command += ["--faults", "kill@phase=optimizer_step,step=6,rank=1"]
    command += ["--", TRAIN_SCRIPT, f"--data={data}", "--steps=12", "--global-batch=32", "--no-progress"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
        assert json.loads(f.readline())["event"] == "shrink"
    ranks = []
    for name in ("rank-0.jsonl", "rank-1.jsonl"):
        with open(os.path.join(run_dir, "samples", name)) as f:
            ranks.append(f.readlines())
    rank0 = [json.loads(line)["step"] for line in ranks[0]]
    assert rank0.count(6) == 1, "rank 0 redid step 6: it did not complete the step rank 1 died in"
    rank1 = [json.loads(line)["step"] for line in ranks[1]]
    assert rank1[:6] == [1, 2, 3, 4, 5, 6]  # then the replacement's steps, if it grew back within the run
    steps = global_steps(ranks)
    assert sorted(steps) == list(range(1, 13))
    assert {step: len(ids) for step, ids in steps.items()} == dict.fromkeys(range(1, 13), 32)
    assert trained_twice(steps, step_epochs(ranks)) == []
