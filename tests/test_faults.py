"""Fault plans: parsing, once-per-run firing across attempts, random victims, and real kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from goodput.errors import ConfigError
from goodput.faults import Fault, FaultPlan, InjectedFault, parse_faults


def test_parse_a_plan_with_every_trigger() -> None:
    plan = parse_faults(
        "kill@step=30,rank=1; raise@phase=checkpoint_write; slow@step=2,seconds=0.5; kill@mtbf=2m"
    )
    assert plan == [
        Fault(action="kill", step=30, rank=1),
        Fault(action="raise", phase="checkpoint_write"),
        Fault(action="slow", step=2, seconds=0.5),
        Fault(action="kill", mtbf=120.0),
    ]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("explode@step=1", "action 'explode'"),
        ("kill@steps=1", "'steps=1' is not KEY=VALUE"),
        ("kill", "needs step=, phase= or mtbf="),
        ("kill@phase=lunch", "phase 'lunch'"),
        ("kill@mtbf=10", "needs a number and a unit"),
        ("kill@mtbf=1m,step=3", "either mtbf= or step="),
        ("kill@step=x", "kill@step=x"),
    ],
)
def test_bad_plans_name_the_problem(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_faults(text)


def test_step_fault_fires_once_per_run_across_attempts(tmp_path: os.PathLike[str]) -> None:
    faults = parse_faults("raise@step=3")
    fired = []
    first = FaultPlan(faults, attempt=0, marker_dir=str(tmp_path), on_fire=lambda f, w: fired.append(w))
    first.check(step=2)
    with pytest.raises(InjectedFault, match="step at step 3"):
        first.check(step=3)
    # The restarted attempt passes step 3 again and must not fail again.
    second = FaultPlan(faults, attempt=1, marker_dir=str(tmp_path))
    second.check(step=3)
    assert fired == ["step at step 3"]


def test_faults_for_another_rank_or_attempt_do_not_apply() -> None:
    faults = parse_faults("raise@step=1,rank=1; raise@step=1,attempt=2")
    assert not FaultPlan(faults, rank=0, attempt=0)
    FaultPlan(faults, rank=0, attempt=0).check(step=1)
    with pytest.raises(InjectedFault):
        FaultPlan(faults, rank=1, attempt=0).check(step=1)


def test_phase_fault_fires_at_the_first_phase_at_or_after_its_step() -> None:
    plan = FaultPlan(parse_faults("raise@phase=checkpoint_write,step=10"))
    plan.check(phase="checkpoint_write", step=5)
    plan.check(phase="step", step=12)
    with pytest.raises(InjectedFault):
        plan.check(phase="checkpoint_write", step=12)


def test_random_fault_picks_exactly_one_victim_per_attempt() -> None:
    faults = parse_faults("raise@mtbf=1h,seed=7")
    for attempt in range(20):
        armed = [
            FaultPlan(faults, rank=r, world_size=4, attempt=attempt)._deadlines["raise@mtbf=3600.0,seed=7#0"]
            for r in range(4)
        ]
        assert sum(d is not None for d in armed) == 1


def test_kill_is_a_real_sigkill(tmp_path: os.PathLike[str]) -> None:
    code = (
        "from goodput.faults import FaultPlan, parse_faults\n"
        f"FaultPlan(parse_faults('kill@step=1'), marker_dir={str(tmp_path)!r}).check(step=1)\n"
        "print('survived')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert "survived" not in proc.stdout
    assert os.listdir(tmp_path) == ["kill@step=1#0-rank0"]


def test_a_plan_that_can_never_fire_is_refused_naming_the_fault() -> None:
    from goodput.faults import check_plan

    plan = parse_faults("kill@step=30,rank=1; raise@phase=checkpoint_write,step=90")
    check_plan(plan, world_size=2, total_steps=100)  # every fault can fire
    with pytest.raises(
        ConfigError,
        match=r"kill@step=30,rank=1 can never fire: rank 1 does not exist in a job of 1 rank \(ranks 0..0\)",
    ):
        check_plan(plan, world_size=1)
    with pytest.raises(
        ConfigError,
        match=r"raise@phase=checkpoint_write,step=90 can never fire: step 90 is past the run's last step 50",
    ):
        check_plan(plan, total_steps=50)


def test_a_job_that_shrank_keeps_the_plan_of_the_ranks_it_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a shrink in place to 1 of 2 reserved ranks, a fault for rank 1 is not refused (it fires once the
    job grows back); a rank beyond the reservation still is."""
    from goodput._env import RESERVED_WORLD
    from goodput.run._setup import checked_plan

    monkeypatch.setenv(RESERVED_WORLD.name, "2")
    assert len(checked_plan("nan@step=36,rank=1", 1, 100, numeric_on=True)) == 1
    with pytest.raises(ConfigError, match="rank 2 does not exist in a job of 2 ranks"):
        checked_plan("kill@step=3,rank=2", 1, 100, numeric_on=True)


def test_the_demo_plan_drills_a_nan_that_comes_back_one_spike_and_one_flipped_bit_within_its_steps() -> None:
    from goodput.demo.main import DemoConfig, numeric_faults
    from goodput.faults import check_plan

    for nproc, steps in ((2, 2000), (3, 2500)):
        config = DemoConfig(run_dir="unused", nproc=nproc, steps=steps)
        plan = parse_faults(f"kill@mtbf=40s,seed=0; {numeric_faults(config)}")
        check_plan(plan, world_size=nproc, total_steps=steps)
        drilled = sorted((f.action, f.step) for f in plan if f.action != "kill")
        assert [a for a, _ in drilled] == ["bitflip", "nan", "nan", "spike"]  # the NaN again on its redo
        assert len({s for a, s in drilled if a == "nan"}) == 1
        assert all(0 < step < steps for _, step in drilled)


def test_a_persistent_slow_fault_fires_once_per_rank_so_the_process_that_takes_the_rank_later_is_not_slowed(
    tmp_path: os.PathLike[str],
) -> None:
    (fault,) = parse_faults("slow@rank=1,factor=1.5,persist")
    assert (fault.action, fault.rank, fault.step, fault.factor, fault.persist) == ("slow", 1, None, 1.5, True)
    fired: list[str] = []
    marker_dir = os.path.join(tmp_path, "faults")
    first = FaultPlan([fault], rank=1, marker_dir=marker_dir, on_fire=lambda f, where: fired.append(where))
    for step in (1, 2, 3):
        first.check(step=step)
    assert fired == ["step at step 1"]  # once, then it lasts in this process
    spare = FaultPlan([fault], rank=1, marker_dir=marker_dir, on_fire=lambda f, where: fired.append(where))
    spare.check(step=4)
    assert fired == ["step at step 1"]


@pytest.mark.parametrize(
    "text", ["kill@step=3,persist", "slow@mtbf=10s,persist", "slow@phase=restore,persist"]
)
def test_persist_applies_only_to_a_slow_fault_at_steps(text: str) -> None:
    with pytest.raises(ConfigError, match="persist applies to a slow fault"):
        parse_faults(text)


def test_a_relaunch_with_another_plan_inherits_no_marker_of_a_fault_it_does_not_have(
    tmp_path: os.PathLike[str],
) -> None:
    """Markers are named by the fault's own text, not its place in the plan: the same fault, however spelled
    and wherever it stands, fired already; another plan's first fault did not (the old names, by place, made
    the second plan's step-5 fault look fired and skipped it)."""
    marker_dir = os.path.join(tmp_path, "faults")
    fired: list[int | None] = []

    def plan(text: str) -> FaultPlan:
        return FaultPlan(parse_faults(text), marker_dir=marker_dir, on_fire=lambda f, _: fired.append(f.step))

    plan("slow@step=3,seconds=0").check(step=3)
    other = plan("slow@step=5,seconds=0; slow@seconds=0,step=3; slow@step=3,seconds=0")
    for step in (3, 4, 5):
        other.check(step=step)
    # the repeated step-3 fault fires once more (its place among equal faults), the step-5 one fires
    assert fired == [3, 3, 5]
    assert sorted(os.listdir(marker_dir)) == [
        "slow@step=3,seconds=0.0#0-rank0", "slow@step=3,seconds=0.0#1-rank0", "slow@step=5,seconds=0.0#0-rank0"
    ]  # fmt: skip
