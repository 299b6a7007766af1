"""``goodput verify-resume --restart warm --spares 0 --shrink-after S``: a verdict that knows the world size
changed. The pure parts on records built by hand (which records count, the world-size schedule, exactly once
from sample ids), the flags' one-line refusals, and the whole verdict on a script that shrinks 3 -> 2 -> 1 and on a
user's script with dropout (every rank's random stream after the shrink is the reference's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from goodput.verify.compare import compare_records
from goodput.verify.records import RunRecords, StepRecord, StepRecorder, read_records
from goodput.verify.shrink import effective, exactly_once, world_schedule
from tests.helpers import paths

SHRINK = paths.script("shrink_train.py")
DROPOUT = paths.script("dropout_warm_train.py")


def _step(step: int, rank: int, attempt: int, world: int, ids: tuple[int, ...]) -> StepRecord:
    return StepRecord(
        step=step, rank=rank, attempt=attempt, resumed=0, samples=None, count=len(ids), loss=None, rng={},
        world=world, ids=ids,
    )  # fmt: skip


def _records(*records: StepRecord) -> RunRecords:
    steps: dict[int, dict[int, StepRecord]] = {}
    for r in records:
        steps.setdefault(r.rank, {})[r.step] = r
    return RunRecords(steps=steps, final={}, attempts=sorted({r.attempt for r in records}))


# A fixed-world run of 2 ranks: step s trains samples 4s..4s+3, two on each rank.
CLEAN = _records(
    *(_step(s, r, 0, 2, (4 * s + 2 * r, 4 * s + 2 * r + 1)) for s in (1, 2, 3, 4) for r in (0, 1))
)
# Rank 1 dies after training step 2; rank 0 had not finished it: rank 0 alone trains steps 2-3 again (attempt
# 1, the whole global batch), and a replacement grows the job back for step 4 (attempt 2).
SHRUNK = _records(
    *(_step(1, r, 0, 2, (4 + 2 * r, 5 + 2 * r)) for r in (0, 1)),
    _step(2, 1, 0, 2, (10, 11)),
    _step(2, 0, 1, 1, (8, 9, 10, 11)),
    _step(3, 0, 1, 1, (12, 13, 14, 15)),
    *(_step(4, r, 2, 2, (16 + 2 * r, 17 + 2 * r)) for r in (0, 1)),
)


class _Loader:
    last_indices = (7, 3)


def test_records_carry_each_attempt_s_world_size_and_each_step_s_sample_ids(tmp_path: str) -> None:
    for attempt, world, rank in ((0, 2, 1), (1, 1, 0)):
        recorder = StepRecorder(str(tmp_path), rank=rank, attempt=attempt, world=world)
        recorder.step(attempt + 1, loaders=[_Loader()], loss=None)
        recorder.close()
    steps = read_records(str(tmp_path)).steps
    assert (steps[1][1].world, steps[1][1].ids, steps[0][2].world, steps[0][2].ids) == (2, (7, 3), 1, (7, 3))


def test_a_step_counts_only_the_ranks_of_the_last_attempt_that_trained_it() -> None:
    kept = effective(SHRUNK)
    assert sorted(kept.steps[1]) == [1, 4] and sorted(kept.steps[0]) == [1, 2, 3, 4]
    assert world_schedule(SHRUNK) == [(1, 2), (2, 1), (4, 2)]
    assert world_schedule(CLEAN) == [(1, 2)]


def test_a_rank_that_neither_run_had_at_a_step_is_no_difference() -> None:
    assert compare_records(effective(SHRUNK), effective(SHRUNK)) == []


def test_exactly_once_holds_over_world_sizes_and_names_the_first_step_that_breaks_it() -> None:
    assert exactly_once(CLEAN, SHRUNK) is None
    repeated = _records(*SHRUNK.steps[1].values(), *SHRUNK.steps[0].values())
    repeated.steps[0][3] = _step(3, 0, 1, 1, (8, 13, 14, 15))  # sample 8 again, 12 never
    assert exactly_once(CLEAN, repeated) == (
        "step 3 trained samples [8, 13, 14, 15] where the uninterrupted run trained [12, 13, 14, 15]"
    )


def _verify(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "goodput", "verify-resume", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--shrink-after", "0", "--spares", "0", "--", SHRINK], "add --restart warm"),
        (["--restart", "warm", "--shrink-after", "0", "--", SHRINK], "add --spares 0"),
        (["--restart", "warm", "--spares", "0", "--shrink-after", "0"], "give it after '--'"),
        (["--restart", "warm", "--min-world", "2", "--", SHRINK], "add --shrink-after"),
    ],
)
def test_the_shrink_flags_are_refused_in_one_line_where_they_mean_nothing(args: list[str], says: str) -> None:
    proc = _verify(*args)
    assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.slow
def test_a_script_that_shrinks_3_to_2_to_1_matches_a_reference_on_the_same_world_sizes(tmp_path: str) -> None:
    work = os.path.join(tmp_path, "work")
    flags = ["--restart", "warm", "--spares", "0", "--shrink-after", "0", "--nproc", "3", "--kills", "2"]
    proc = _verify(*flags, "--work-dir", work, "--", SHRINK, "--spare-after-step", "1000000", timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "world sizes: 3 from step 1, 2 from step" in proc.stdout and ", 1 from step" in proc.stdout
    assert "IDENTICAL: every step trained the uninterrupted run's global batch, each sample exactly once" in (
        proc.stdout
    )


@pytest.mark.slow
def test_a_user_script_with_dropout_verifies_after_a_shrink(tmp_path: str) -> None:
    """A DDP script from the README with dropout: the kill inside rank 1's checkpoint write shrinks 3 ranks to 2,
    and old rank 2 becomes rank 1. Its first step after the shrink draws the masks that the reference's cold
    resume on 2 ranks gives rank 1 (old rank 1's saved stream), and the final RNG states match too."""
    work = os.path.join(tmp_path, "work")
    flags = ["--restart", "warm", "--spares", "0", "--shrink-after", "0", "--nproc", "3", "--kills", "2"]
    proc = _verify(*flags, "--work-dir", work, "--", DROPOUT, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "kill@phase=checkpoint_write,step=2,rank=1" in proc.stdout
    assert "world sizes: 3 from step 1, 2 from step 3" in proc.stdout
    assert "final model, optimizer, scheduler, RNG and data position, match a reference" in proc.stdout


@pytest.mark.slow
def test_a_loader_that_cannot_keep_its_global_batch_is_refused_before_anything_trains(tmp_path: str) -> None:
    """A README script whose loader takes a per-rank batch_size: under --shrink-after every shrink would change
    the global batch, so verify says so in one line (exit 2) from the first run's start, not after training the
    whole uninterrupted run and failing the interrupted one."""
    work = os.path.join(tmp_path, "work")
    flags = ["--restart", "warm", "--spares", "0", "--shrink-after", "0", "--nproc", "2", "--kills", "1"]
    proc = _verify(*flags, "--work-dir", work, "--", paths.script("verify_user_train.py"), timeout=120)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and "global_batch_size" in proc.stderr, proc.stderr
    assert "uninterrupted:" not in proc.stdout  # refused in the first run (it used to train it whole first)


def test_a_run_of_two_epochs_trains_each_sample_once_an_epoch_and_that_is_no_difference() -> None:
    """The second epoch trains the first epoch's samples again, in the uninterrupted run as in the shrunk one:
    exactly once means as often as the uninterrupted run, step by step, not once over the whole run."""
    epoch = (0, 1, 2, 3, 4, 5, 6, 7)  # two steps of four samples, two on each of 2 ranks
    clean = _records(
        *(_step(s, r, 0, 2, epoch[4 * ((s - 1) % 2) + 2 * r :][:2]) for s in (1, 2, 3, 4) for r in (0, 1))
    )
    shrunk = _records(
        *(_step(s, r, 0, 2, epoch[4 * ((s - 1) % 2) + 2 * r :][:2]) for s in (1, 2) for r in (0, 1)),
        *(_step(s, 0, 1, 1, epoch[4 * ((s - 1) % 2) :][:4]) for s in (3, 4)),
    )
    assert exactly_once(clean, shrunk) is None
