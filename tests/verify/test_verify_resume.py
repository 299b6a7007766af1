"""``goodput verify-resume -- train.py``: what Run records, how two runs are compared, and the command itself.

The slow tests run a user's script written from the README alone (tests/scripts/verify_user_train.py: its own
model and dataset, DDP, ResumableLoader, Run) under the real command: as written it must pass; with noise from
a clock-seeded generator, or with its loader kept out of the checkpoint, it must fail naming the first
differing step, and in neither case may a worker's traceback reach the terminal.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import goodput as gp
from goodput.faults import parse_faults
from goodput.verify.compare import compare_records, drawn_generators, idle_generators
from goodput.verify.records import RunRecords, StepRecord, StepRecorder, read_records, state_digests
from goodput.verify.script import kill_plan
from tests.helpers.paths import script

SCRIPT = script("verify_user_train.py")


def _loader(world_size: int = 1) -> gp.ResumableLoader:
    data = torch.utils.data.TensorDataset(torch.arange(64.0))
    return gp.ResumableLoader(data, batch_size=4, seed=3, rank=0, world_size=world_size)


def test_records_keep_the_last_time_each_step_was_trained(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    loader = _loader()
    first = StepRecorder(run_dir, rank=0, attempt=0)
    batches = iter(loader)
    seen = []
    for step in range(1, 6):
        seen.append(next(batches)[0].tolist())
        assert loader.last_indices.tolist() == [int(v) for v in seen[-1]]  # the data are their own indices
        first.step(step, loaders=(None, loader), loss=1.0 / step)
    first.close()
    with open(os.path.join(run_dir, "records", "attempt-0.rank-0.jsonl"), "a") as f:
        f.write('{"step": 6, "sampl')  # a writer killed mid-line
    # attempt 1 resumes from step 3 with the position after step 3, and trains steps 4 and 5 again
    resumed = _loader()
    resumed.load_state_dict({**loader.state_dict(), "consumed": 12})
    second = StepRecorder(run_dir, rank=0, attempt=1)
    again = iter(resumed)
    for step in (4, 5):
        assert next(again)[0].tolist() == seen[step - 1]
        second.step(step, loaders=(resumed,), loss=2.0)
    second.close()

    records = read_records(run_dir)
    steps = records.steps[0]
    assert sorted(steps) == [1, 2, 3, 4, 5] and records.attempts == [0, 1]
    assert [steps[s].attempt for s in (3, 4)] == [0, 1] and steps[4].resumed == 3
    assert float.fromhex(steps[4].loss or "") == 2.0 and float.fromhex(steps[3].loss or "") == 1.0 / 3
    assert steps[4].count == 4 and steps[5].samples != steps[4].samples
    first_time = {s: r.samples for s, r in steps.items()}
    assert len(set(first_time.values())) == 5  # five different batches, five different digests
    assert set(steps[1].rng) >= {"python", "numpy", "torch"}


def test_state_digests_name_each_piece_and_change_with_it_alone() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    state = gp.TrainingState(model=model, optimizer=opt, scheduler=sched, loader=_loader())
    before = state_digests(state)
    assert {"model.0.weight", "optimizer.state.0.weight.exp_avg", "scheduler.last_epoch", "step"} <= set(
        before
    )
    assert {"rng.torch", "rng.python", "loader.consumed"} <= set(before)
    assert before["scheduler.last_epoch"] == "1"

    with torch.no_grad():
        opt.state[model[0].weight]["exp_avg"][0, 0] += 1e-7
    changed = state_digests(state)
    assert [k for k in before if before[k] != changed[k]] == ["optimizer.state.0.weight.exp_avg"]
    torch.rand(1)
    drawn = state_digests(state)
    assert [k for k in changed if changed[k] != drawn[k]] == ["rng.torch"]


def _records(steps: dict[int, list[StepRecord]], final: dict[int, dict[str, str]]) -> RunRecords:
    by_rank: dict[int, dict[int, StepRecord]] = {}
    for rank, records in steps.items():
        by_rank[rank] = {r.step: r for r in records}
    finals = {rank: {"attempt": 0, "step": 8, "state": state} for rank, state in final.items()}
    return RunRecords(
        steps=by_rank, final=finals, attempts=sorted({r.attempt for rs in steps.values() for r in rs})
    )


def _step(
    step: int, rank: int, *, attempt: int = 0, resumed: int = 0, samples: str = "", loss: float = 1.0
) -> StepRecord:
    return StepRecord(
        step=step, rank=rank, attempt=attempt, resumed=resumed, samples=samples or f"s{step}r{rank}", count=4,
        loss=float(loss).hex(), rng={"python": "p", "numpy": "n", "torch": f"t{step}"},
    )  # fmt: skip


FINAL = {
    "model.w": "tensor:aa",
    "optimizer.state.0.exp_avg": "tensor:bb",
    "step": "8",
    "rng.torch": "json:cc",
}


def test_identical_records_have_no_difference() -> None:
    clean = _records({r: [_step(s, r) for s in range(1, 9)] for r in (0, 1)}, {0: FINAL, 1: FINAL})
    resumed = _records(
        {r: [_step(s, r, attempt=1 if s > 4 else 0, resumed=4 if s > 4 else 0) for s in range(1, 9)] for r in (0, 1)},
        {0: FINAL, 1: FINAL},
    )  # fmt: skip
    assert compare_records(clean, resumed) == []


def test_the_first_differing_step_and_piece_are_named_with_where_the_step_ran() -> None:
    clean = _records({r: [_step(s, r) for s in range(1, 9)] for r in (0, 1)}, {0: FINAL, 1: FINAL})
    after = {
        r: [_step(s, r, attempt=1 if s > 4 else 0, resumed=4 if s > 4 else 0) for s in range(1, 9)]
        for r in (0, 1)
    }
    after[1][5] = _step(6, 1, attempt=1, resumed=4, samples="other")
    after[0][6] = _step(7, 0, attempt=1, resumed=4, loss=2.0)
    final = {**FINAL, "optimizer.state.0.exp_avg": "tensor:ff", "step": "9"}
    found = compare_records(clean, _records(after, {0: final, 1: FINAL}))
    assert [str(d) for d in found] == [
        "step 6: rank 1's sample indices differ (attempt 1, 2 steps after resuming from step 4)",
        "final state: optimizer.state.0.exp_avg differs (on rank 0; 1 more piece differ)",
    ]
    assert any("run.restore(loader=" in c for c in found[0].causes)


def test_a_loss_that_differs_right_after_a_resume_also_names_ddps_bucket_layout() -> None:
    clean = _records({0: [_step(s, 0) for s in range(1, 5)]}, {0: FINAL})
    after = [_step(s, 0, attempt=1 if s > 2 else 0, resumed=2 if s > 2 else 0) for s in range(1, 5)]
    after[2] = _step(3, 0, attempt=1, resumed=2, loss=1.0000001)
    (found,) = compare_records(clean, _records({0: after}, {0: FINAL}))
    assert str(found).startswith("step 3: rank 0's loss differs")
    assert any("run.restore()" in c for c in found.causes) and any("bucket" in c for c in found.causes)


def test_a_difference_before_any_restart_points_at_nondeterminism() -> None:
    clean = _records({0: [_step(s, 0) for s in range(1, 5)]}, {0: FINAL})
    noisy = _records({0: [_step(1, 0), _step(2, 0, loss=1.5), *[_step(s, 0) for s in (3, 4)]]}, {0: FINAL})
    (found,) = compare_records(clean, noisy)
    assert str(found).startswith("step 2: rank 0's loss differs (1.0 uninterrupted, 1.5 interrupted; ")
    assert "before any restart" in found.detail and "without a resume" in found.detail
    assert any("unseeded" in c for c in found.causes) and any("deterministic" in c for c in found.causes)


def test_a_step_redone_by_an_attempt_that_restored_nothing_is_not_blamed_on_a_resume() -> None:
    clean = _records({0: [_step(s, 0) for s in range(1, 5)]}, {0: FINAL})
    redone = [_step(s, 0, attempt=1, loss=2.0 if s == 3 else 1.0) for s in range(1, 5)]
    (found,) = compare_records(clean, _records({0: redone}, {0: FINAL}))
    assert str(found).startswith(
        "step 3: rank 0's loss differs"
    ) and "attempt 1, which restored nothing" in str(found)
    assert any("unseeded" in c for c in found.causes)


def test_a_generator_that_drifts_after_a_resume_is_named() -> None:
    clean = _records({0: [_step(s, 0) for s in range(1, 5)]}, {0: FINAL})
    steps = [_step(1, 0), _step(2, 0), _step(3, 0, attempt=1, resumed=2), _step(4, 0, attempt=1, resumed=2)]
    steps[2] = StepRecord(**{**steps[2].__dict__, "rng": {"python": "p", "numpy": "n", "torch": "drift"}})
    (found,) = compare_records(clean, _records({0: steps}, {0: FINAL}))
    assert str(found) == (
        "step 3: rank 0's torch random generator state differs (attempt 1, the first step after resuming from step 2)"
    )


def _with_rng(record: StepRecord, **rng: str) -> StepRecord:
    return StepRecord(**{**record.__dict__, "rng": {**record.rng, **rng}})


def test_a_generator_the_run_never_drew_from_is_not_compared_but_named() -> None:
    """An unseeded ``random`` that training never touches: its state differs between the runs, stays constant
    within each, and cannot have changed the result."""
    clean = _records(
        {r: [_with_rng(_step(s, r), python="x") for s in range(1, 9)] for r in (0, 1)}, {0: FINAL, 1: FINAL}
    )
    after = {
        r: [
            _with_rng(_step(s, r, attempt=1 if s > 4 else 0, resumed=4 if s > 4 else 0), python="y")
            for s in range(1, 9)
        ]
        for r in (0, 1)
    }
    final = {**FINAL, "rng.python": "json:other"}
    resumed = _records(after, {0: final, 1: final})
    assert drawn_generators(clean) == {0: {"torch"}, 1: {"torch"}}
    assert compare_records(clean, resumed) == []
    assert idle_generators(clean, resumed) == ["random"]
    assert idle_generators(clean, clean) == []


def test_a_generator_drawn_from_in_either_run_is_still_compared() -> None:
    clean = _records({0: [_with_rng(_step(s, 0), python="x") for s in range(1, 5)]}, {0: FINAL})
    # the interrupted run draws from ``random`` at step 3 (its state moves), the uninterrupted one never does
    drawn = [_with_rng(_step(s, 0), python="x" if s < 3 else "z") for s in range(1, 5)]
    (found,) = compare_records(clean, _records({0: drawn}, {0: FINAL}))
    assert str(found).startswith("step 3: rank 0's random random generator state differs")
    assert idle_generators(clean, _records({0: drawn}, {0: FINAL})) == []
    # a state restored by a resume (attempt 0 -> 1) is no draw: constant within each attempt is idle
    restored = [
        _with_rng(_step(s, 0, attempt=s // 3, resumed=2 if s > 2 else 0), python=f"a{s // 3}")
        for s in range(1, 5)
    ]
    assert drawn_generators(_records({0: restored}, {0: FINAL}))[0] == {"torch"}


def test_kill_plan_hits_steps_after_the_first_save_and_every_save_phase() -> None:
    saves = [4, 8, 12, 16]
    plan = kill_plan(4, steps=16, saves=saves, nproc=2, seed=5, async_saves=True)
    faults = parse_faults(plan)
    assert len(faults) == 4 and plan == kill_plan(4, steps=16, saves=saves, nproc=2, seed=5, async_saves=True)
    assert [f.phase for f in faults] == ["step", "checkpoint_write", "step", "async_upload"]
    assert all(4 < (f.step or 0) < 16 for f in faults if f.phase == "step")
    assert all(f.step in saves for f in faults if f.phase != "step") and all(f.rank in (0, 1) for f in faults)
    sync = parse_faults(kill_plan(6, steps=16, saves=saves, nproc=2, seed=5, async_saves=False))
    assert [f.phase for f in sync if f.phase != "step"] == ["checkpoint_write", "restore", "checkpoint_write"]


def _verify(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "goodput", "verify-resume", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--", "no-such-train.py"], "does not exist"),
        (["--steps", "10", "--", SCRIPT], "--steps"),
        (["--kills", "-1", "--", SCRIPT], "--kills"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    proc = _verify(*args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert (
        says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    )


@pytest.mark.slow
def test_the_readme_loop_passes(tmp_path: os.PathLike[str]) -> None:
    proc = _verify("--kills", "2", "--seed", "1", "--work-dir", str(tmp_path), "--", SCRIPT, "--steps", "16")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "IDENTICAL" in proc.stdout and "after 2 restarts (2 kills fired)" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert read_records(os.path.join(tmp_path, "interrupted")).attempts == [0, 1, 2]


@pytest.mark.slow
def test_a_loader_outside_run_fails_at_the_first_step_after_a_resume(tmp_path: os.PathLike[str]) -> None:
    proc = _verify(
        "--kills", "1", "--work-dir", str(tmp_path), "--", SCRIPT, "--steps", "16", "--broken", "loader"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = next(line for line in proc.stdout.splitlines() if line.startswith("DIFFERENT"))
    assert "sample indices differ" in first and "the first step after resuming from step" in first, (
        proc.stdout
    )
    assert "run.restore(loader=" in proc.stdout
    # The survivors' gloo tracebacks went to the run folder, not the terminal.
    assert "Traceback" not in proc.stdout + proc.stderr
    log = os.path.join(tmp_path, "interrupted", "output.log")
    with open(log) as f:
        # torchrun's report of the group's first failure, kept out of the terminal. The status it names is a race
        # inside torchrun, so it is not pinned: the SIGKILL (-9), or the survivor's when its error file was
        # stamped a second before torchrun polled the killed rank (1, or -15 when torchrun's own SIGTERM ended
        # the survivor's exit: torchrun names the failure with the earliest stamp, a signal's being the poll's)
        assert re.search(r"failed \(exitcode: -?\d+\) local_rank", f.read())
    assert log in proc.stdout and "exitcode" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_unseeded_noise_fails_before_any_restart(tmp_path: os.PathLike[str]) -> None:
    proc = _verify(
        "--kills", "1", "--work-dir", str(tmp_path), "--", SCRIPT, "--steps", "8", "--broken", "rand"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIFFERENT: step 1: rank 0's loss differs" in proc.stdout, proc.stdout
    assert "the runs differ without a resume" in proc.stdout
    assert "unseeded randomness" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr


def _verify_python_random(tmp_path: os.PathLike[str], mode: str) -> subprocess.CompletedProcess[str]:
    """verify-resume (one rank, one kill) of the user script, which leaves Python's `random` unseeded and
    draws from it (`mode` "drawn") or never touches it ("unused")."""
    args = ("--nproc", "1", "--kills", "1", "--seed", "2", "--work-dir", str(tmp_path))
    return _verify(*args, "--", SCRIPT, "--steps", "8", "--python-random", mode)


@pytest.mark.slow
def test_an_unseeded_generator_the_script_never_uses_is_a_warning_not_a_difference(
    tmp_path: os.PathLike[str],
) -> None:
    proc = _verify_python_random(tmp_path, "unused")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (warning,) = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    assert "the state of random differs between the two runs, but training never drew from it" in warning
    assert "IDENTICAL" in proc.stdout


@pytest.mark.slow
def test_an_unseeded_generator_the_script_draws_from_still_fails(tmp_path: os.PathLike[str]) -> None:
    proc = _verify_python_random(tmp_path, "drawn")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIFFERENT: step 1: rank 0's random random generator state differs" in proc.stdout, proc.stdout
    assert "warning:" not in proc.stdout


@pytest.mark.slow
def test_a_script_without_run_is_a_user_error(tmp_path: os.PathLike[str]) -> None:
    script = os.path.join(tmp_path, "plain.py")
    with open(script, "w") as f:
        f.write("print('training without goodput')\n")
    proc = _verify("--nproc", "1", "--work-dir", str(tmp_path), "--", script)
    assert proc.returncode == 2 and "recorded no step" in proc.stderr and "Traceback" not in proc.stderr
