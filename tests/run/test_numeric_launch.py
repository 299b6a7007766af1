"""The numeric guard over real torchrun gloo processes (``goodput launch``, DDP with 2 and 3 ranks, FSDP2): NaN/Inf
in one rank's loss or gradients, spikes and flipped bits are found by every rank, rolled back in place, the data
of a fault that comes back is skipped (also after a SIGKILL and cold restart), and a fault the ladder cannot fix
stops the job with EXIT_NUMERIC and one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np

from goodput.data.order import EpochOrder
from goodput.job.codes import EXIT_NUMERIC
from goodput.ledger.accounting import account
from goodput.ledger.ledger import read_events
from goodput.run.numeric import read_skips
from tests.helpers.launching import warm_launch
from tests.helpers.paths import script

SCRIPT = script("numeric_train.py")
SIZE, BATCH = 256, 2


def _launch(run_dir: str, nproc: int, faults: str, *args: str, restarts: int = 0) -> subprocess.CompletedProcess[str]:  # fmt: skip
    command = [sys.executable, "-m", "goodput", "launch", "--nproc", str(nproc), "--run-dir", run_dir]
    command += ["--max-restarts", str(restarts), *(["--faults", faults] if faults else [])]
    command += ["--", SCRIPT, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def _events(run_dir: str, name: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir, rank=0) if e["event"] == name]


def _kept_samples(run_dir: str, nproc: int) -> list[int]:
    """The samples of the steps each rank kept (the last record of every step number), over all ranks."""
    kept: list[int] = []
    for rank in range(nproc):
        last: dict[int, list[int]] = {}
        with open(os.path.join(run_dir, f"samples-rank-{rank}.jsonl")) as f:
            for line in f:
                record = json.loads(line)
                last[record["step"]] = record["indices"]
        kept += [i for step in sorted(last) for i in last[step]]
    return kept


def _positions(lo: int, hi: int) -> list[int]:
    return EpochOrder(seed=0, epoch=0, size=SIZE).at(np.arange(lo, hi)).tolist()


def _report(run_dir: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "goodput", "report", run_dir], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _rollback_gauge(run_dir: str) -> float:
    from goodput.integrations.prometheus import _account

    figures = _account(run_dir)
    assert figures is not None
    return float(figures["rollbacks"])


def _finals(run_dir: str, nproc: int) -> list[dict[str, Any]]:
    out = []
    for rank in range(nproc):
        with open(os.path.join(run_dir, f"final-rank-{rank}.json")) as f:
            out.append(json.load(f))
    return out


def test_nan_inf_and_spike_are_rolled_back_in_place(tmp_path: os.PathLike[str]) -> None:
    run_dir = os.path.join(tmp_path, "run")
    # step 12's gradients are checked (grads_every=4): its Inf is dropped before the optimizer step
    plan = "nan@step=6,rank=1; nan@step=12,rank=0,into=grad,value=inf; spike@step=14,factor=50"
    proc = _launch(run_dir, 2, plan, "--steps", "20", "--workers", "2")  # batches received ahead
    assert proc.returncode == 0, proc.stderr[-3000:]
    faults = [(e["kind"], e["step"], e["on_rank"], e["detail"]) for e in _events(run_dir, "numeric_fault")]
    assert faults == [
        ("nonfinite", 6, 1, "the loss"),
        ("nonfinite", 12, None, "the reduced gradients"),  # DDP: one rank's NaN reaches every rank's bucket
        ("spike", 14, None, faults[2][3]),
    ]
    # Every verdict rides an all-gather read one step later: detected at the next step_done.
    assert [e["detected_at"] - e["step"] for e in _events(run_dir, "numeric_fault")] == [1, 1, 1]
    rollbacks = [(e["from_step"], e["to_step"], e["tier"]) for e in _events(run_dir, "rollback")]
    assert rollbacks == [(6, 4, "memory"), (12, 10, "memory"), (14, 12, "memory")]
    assert _events(run_dir, "skip") == []  # none came back: nothing skipped
    accounting = account(read_events(run_dir, rank=None))
    assert accounting.categories["rollback"] > 0 and accounting.restarts == 0  # no process restarted
    report = _report(run_dir)
    assert "rolled back from step 6 to 4 (memory" in report and "rollback  " in report
    assert _rollback_gauge(run_dir) == 3
    finals = _finals(run_dir, 2)
    assert finals[0] == finals[1] and finals[0]["step"] == 20  # the replicas agree at the end
    assert sorted(_kept_samples(run_dir, 2)) == sorted(_positions(0, 20 * 2 * BATCH))  # each sample once


def test_a_nan_gradient_on_a_step_the_guard_does_not_check_is_never_trained_on(
    tmp_path: os.PathLike[str],
) -> None:
    """At the defaults (``grads_every=4``) step 10's gradients are not checked: rank 0's NaN reaches both
    replicas' parameters through the all-reduce, and step 11's loss is NaN. The rollback passes over the memory
    checkpoint of step 10, which holds the NaN, to step 8, the last replica check that found every parameter
    finite; the run then ends exactly as the same run without the fault, each sample trained once."""
    run_dir, clean_dir = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "clean")
    proc = _launch(run_dir, 2, "nan@step=10,rank=0,into=grad", "--steps", "16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    faults = [(e["kind"], e["step"], e["detail"]) for e in _events(run_dir, "numeric_fault")]
    assert faults == [("nonfinite", 11, "the loss")]
    assert [e["step"] for e in _events(run_dir, "rollback_nonfinite")] == [10]
    assert [(e["from_step"], e["to_step"]) for e in _events(run_dir, "rollback")] == [(11, 8)]
    assert "passed over the checkpoint of step 10: non-finite parameters on 2 rank(s)" in _report(run_dir)
    assert sorted(_kept_samples(run_dir, 2)) == sorted(_positions(0, 16 * 2 * BATCH))
    clean = _launch(clean_dir, 2, "", "--steps", "16")
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert _finals(run_dir, 2) == _finals(clean_dir, 2)


def test_a_fault_in_the_data_is_skipped_and_stays_skipped_after_a_sigkill(tmp_path: os.PathLike[str]) -> None:
    run_dir = os.path.join(tmp_path, "run")
    poison = _positions(36, 37)[0]  # step 10, rank 0's first sample
    # rank 1 is SIGKILLed one step after the skip, and torchrun ends rank 0 milliseconds later (within its
    # ledger's flush period): rank 0's rollback and skip must be on disk; the restart resumes from step 8 or 10
    proc = _launch(run_dir, 2, "kill@step=11,rank=1", "--steps", "24", "--poison", str(poison), restarts=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rollbacks = [(e["from_step"], e["to_step"]) for e in _events(run_dir, "rollback")]
    assert rollbacks == [(10, 8), (10, 8)]  # rolled back, came back: rolled back again and skipped
    (skip,) = _events(run_dir, "skip")
    assert (skip["first_step"], skip["last_step"], skip["first_position"], skip["end_position"]) == (
        9,
        10,
        32,
        40,
    )
    assert poison in skip["indices"] and read_skips(run_dir) == [(0, 32, 40)]
    restores = [e for e in read_events(run_dir, rank=0) if e["event"] == "restore_end" and e.get("step")]
    assert restores[-1]["step"] in (8, 10)  # the SIGKILLed attempt's successor resumed from a checkpoint
    kept = _kept_samples(run_dir, 2)
    assert sorted(kept) == sorted(_positions(0, 32) + _positions(40, 40 + 16 * 2 * BATCH))
    assert poison not in kept
    (line,) = [ln for ln in _report(run_dir).splitlines() if "skipped steps 9-10: 8 samples" in ln]
    assert "positions 32-40 of epoch 0" in line and f" {poison}," in line.replace("[", " ")


def test_three_replicas_name_the_corrupted_one_by_majority(tmp_path: os.PathLike[str]) -> None:
    run_dir = os.path.join(tmp_path, "run")
    proc = _launch(run_dir, 3, "bitflip@step=5,rank=2", "--steps", "12")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (fault,) = _events(run_dir, "numeric_fault")
    assert (fault["kind"], fault["step"], fault["on_rank"]) == ("sdc", 8, 2)
    assert [(e["from_step"], e["to_step"]) for e in _events(run_dir, "rollback")] == [(8, 4)]
    finals = _finals(run_dir, 3)
    assert finals[0] == finals[1] == finals[2]


def test_a_corrupted_replica_rolls_back_to_the_last_agreed_check_past_a_short_save_interval(
    tmp_path: os.PathLike[str],
) -> None:
    """Memory saves every step (2 kept) and no durable save before the end: when the check at step 8 finds rank
    2's flipped bit, the newest saves are steps 8 and 9, and the last check where every replica agreed is step
    4. Retention kept step 4's checkpoint (pinned by the guard), so the run rolls back to it in place instead
    of stopping with "no checkpoint at or before step 4"."""
    run_dir = os.path.join(tmp_path, "run")
    faults, args = "bitflip@step=6,rank=2", ("--steps", "12", "--every", "50", "--memory-every", "1")
    proc = _launch(run_dir, 3, faults, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (fault,) = _events(run_dir, "numeric_fault")
    assert (fault["kind"], fault["step"], fault["on_rank"]) == ("sdc", 8, 2)
    rollbacks = [(e["from_step"], e["to_step"], e["tier"]) for e in _events(run_dir, "rollback")]
    assert rollbacks == [(8, 4, "memory")]
    finals = _finals(run_dir, 3)
    assert finals[0] == finals[1] == finals[2] and finals[0]["step"] == 12


def test_two_replicas_name_the_rank_on_the_redo_and_a_second_corruption_stops(tmp_path: os.PathLike[str]) -> None:  # fmt: skip
    run_dir = os.path.join(tmp_path, "run")
    proc = _launch(run_dir, 2, "bitflip@step=5,rank=1; bitflip@step=13,rank=1", "--steps", "24", restarts=3)
    assert proc.returncode == EXIT_NUMERIC, proc.stderr[-3000:]
    faults = [(e["kind"], e["step"], e["on_rank"]) for e in _events(run_dir, "numeric_fault")]
    assert faults == [("sdc", 8, None), ("sdc", 16, None)]  # two replicas: no majority names one
    named = [(e["named_rank"], e["step"], e["times"]) for e in _events(run_dir, "sdc_named")]
    assert named == [(1, 8, 1), (1, 16, 2)]  # the redo of each check step names rank 1
    *told, stop = [line for line in proc.stderr.splitlines() if line.startswith("goodput launch:")]
    assert "rank 1 corrupted its replica 2 times" in stop and "exit 65" in stop, proc.stderr[-3000:]
    assert (
        len(told) == 3 and "rolled back" in told[0] + told[2] and "rank 1 named corrupt at step 8" in told[1]
    )
    assert len({e["attempt"] for e in read_events(run_dir, rank=0)}) == 3  # no restart, two rollbacks


def test_fsdp2_rolls_back_a_nan_gradient_of_one_rank_and_a_nan_at_the_last_step(tmp_path: os.PathLike[str]) -> None:  # fmt: skip
    """FSDP2: one rank's local shard has the NaN (no bucket hook), so that rank names it; a NaN in the loop's
    last step is judged when the loop ends, rolled back, and the loop goes on to the same last step."""
    run_dir = os.path.join(tmp_path, "run")
    proc = _launch(run_dir, 2, "nan@step=8,rank=0,into=grad; nan@step=10,rank=1", "--steps", "10", "--fsdp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    faults = [(e["kind"], e["step"], e["on_rank"], e["detail"]) for e in _events(run_dir, "numeric_fault")]
    assert faults == [("nonfinite", 8, 0, "a gradient"), ("nonfinite", 10, 1, "the loss")]
    assert [(e["from_step"], e["to_step"]) for e in _events(run_dir, "rollback")] == [(8, 6), (10, 8)]
    assert [f["step"] for f in _finals(run_dir, 2)] == [10, 10]


def test_under_warm_restarts_a_rank_named_corrupt_is_handed_to_a_hot_spare(
    tmp_path: os.PathLike[str],
) -> None:
    """3 replicas name rank 2 by majority; after every rank rolled back, rank 2 exits and the warm agent gives its
    place to a spare, which takes the survivors' rolled-back state; the ledger says why."""
    import goodput.bench

    run_dir = os.path.join(tmp_path, "run")
    train = os.path.join(os.path.dirname(goodput.bench.__file__), "_restart_train.py")
    command = warm_launch(run_dir, nproc=3)
    command += ["--faults", "bitflip@step=13,rank=2", "--collective-timeout", "4", "--", train]
    command += ["--steps", "30", "--every", "10", "--check-every", "10", "--hang-timeout", "60"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # one line says why rank 2 left, naming no exception (a departure goodput chose, not a crash)
    output = proc.stdout + proc.stderr
    assert "Error" not in output and "Traceback" not in output, output[-4000:]
    (line,) = [ln for ln in output.splitlines() if "corrupted its replica" in ln]
    assert line.startswith("goodput launch: rank 2 ") and "hot spare" in line, line
    (fault,) = _events(run_dir, "numeric_fault")
    assert (fault["kind"], fault["step"], fault["on_rank"]) == ("sdc", 20, 2)
    assert [(e["from_step"], e["to_step"]) for e in _events(run_dir, "rollback")] == [(20, 10)]
    (handover,) = _events(run_dir, "sdc_handover")
    assert handover["named_rank"] == 2 and "hot spare" in handover["why"]
    with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
        agent = [json.loads(line) for line in f]
    assert [e["failed"] for e in agent if e["event"] == "warm_restart"] == [[2]]
    with open(os.path.join(run_dir, "final.json")) as f:
        assert json.load(f)["step"] == 30
