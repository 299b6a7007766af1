"""When to save: step and time policies, and ``auto`` wired to the planner within its bounds."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from goodput.checkpoint import AutoInterval, CheckpointConfig, CheckpointManager, TrainingState
from goodput.checkpoint.policy import EveryInterval, EverySteps
from goodput.errors import ConfigError
from goodput.planning import Costs, optimal_interval


def test_every_steps_saves_multiples_once() -> None:
    policy = EverySteps(3)
    due = [step for step in range(0, 10) if policy.due(step, 0.0)]
    assert due == [3, 6, 9]
    policy.saved(6, 0.0)
    assert not policy.due(6, 0.0)


def test_every_interval_counts_from_the_first_step_and_each_save() -> None:
    policy = EveryInterval(10.0)
    assert not policy.due(1, 100.0)
    assert not policy.due(2, 109.9)
    assert policy.due(3, 110.0)
    policy.saved(3, 110.0)
    assert not policy.due(4, 115.0)
    assert policy.due(5, 120.5)


def test_auto_uses_the_planner_optimum_within_bounds_and_logs_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    day = 86400.0
    policy = AutoInterval(mtbf=day, max_interval=3600.0, first_interval=600.0)
    assert policy.interval == 600.0
    with caplog.at_level(logging.INFO, logger="goodput.checkpoint.policy"):
        policy.measured(stall=2.0, persist=8.0)
    assert policy.interval == pytest.approx(optimal_interval(Costs(ckpt_stall=2.0, mtbf=day, persist=8.0)))
    assert 8.0 < policy.interval < 3600.0
    assert "checkpoint interval 600.0s ->" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="goodput.checkpoint.policy"):
        policy.measured(stall=2.0, persist=8.0)  # same medians: no change, no log line
    assert caplog.text == ""
    policy.observe_mtbf(100.0 * day)  # rare failures: the optimum exceeds the user's maximum
    assert policy.interval == 3600.0
    policy.observe_mtbf(60.0)  # failures every minute: bounded below by the persist time
    assert policy.interval >= 8.0
    assert policy.interval == pytest.approx(
        max(optimal_interval(Costs(ckpt_stall=2.0, mtbf=60.0, persist=8.0)), 8.0)
    )


def test_auto_manager_reevaluates_from_measured_saves(tmp_path: Path) -> None:
    now = [0.0]
    model = torch.nn.Linear(4, 2)
    config = CheckpointConfig(
        root=str(tmp_path), strategy="dcp", every="auto", max_interval="30m", gpus=1000, afr=0.1
    )
    manager = CheckpointManager(config, TrainingState(model=model), clock=lambda: now[0])
    policy = manager.policy
    assert isinstance(policy, AutoInterval)
    assert policy.mtbf == pytest.approx(365 * 86400 / 100)  # the prior: a year over (1000 GPUs x 10 %)
    assert not manager.should_save(1)
    now[0] = 600.0  # the first interval before anything was measured
    assert manager.should_save(2)
    result = manager.save(2)
    assert result.persist_seconds is not None
    assert policy.planned_mtbf == pytest.approx(policy.mtbf + 600.0)  # the prior, 600 s without failure later
    expected = optimal_interval(
        Costs(ckpt_stall=result.stall_seconds, mtbf=policy.planned_mtbf, persist=result.persist_seconds)
    )
    assert policy.interval == pytest.approx(min(max(expected, result.persist_seconds), 1800.0))
    manager.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("strategy", "pickle"),
        ("every", 0),
        ("every", "often"),
        ("keep_last", 0),
        ("keep_every", -1),
        ("afr", 0.0),
        ("max_interval", "0s"),
    ],
)
def test_config_refuses_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        CheckpointConfig(root="/tmp/x", **{field: value})  # type: ignore[arg-type]


def test_auto_reports_interval_changes_beyond_ten_percent() -> None:
    changes: list[tuple[float, str]] = []
    policy = AutoInterval(
        mtbf=3600.0, max_interval=3600.0, on_change=lambda i, why, *_: changes.append((i, why))
    )
    policy.measured(2.0, 4.0)
    policy.measured(2.0, 4.0)  # same costs: same interval, nothing new to report
    assert len(changes) == 1 and changes[0][1] == "a save was measured"
    # The median of the last 5 stalls goes 2 -> 2 -> 9 -> 16: two moves past 10% (the optimum grows about as
    # sqrt(C), so 8x the stall is ~2.8x the interval).
    for _ in range(3):
        policy.measured(16.0, 4.0)
    intervals = [i for i, _ in changes]
    assert len(intervals) == 3 and intervals == sorted(intervals) and intervals[-1] > 2 * intervals[0]


def test_auto_before_any_failure_plans_for_an_hour_that_grows_with_each_failure_free_second() -> None:
    """A job of unknown size: no year-long prior from an AFR, so a kill soon after the start loses seconds."""
    config = CheckpointConfig(root="/tmp/x", every="auto")
    assert config.prior_mtbf(world_size=2) == config.prior_mtbf(world_size=1024) == 3600.0
    policy = AutoInterval(mtbf=config.prior_mtbf(world_size=2), max_interval=config.seconds("max_interval"))
    assert policy.interval == 0.0  # the first save comes at once, to measure what a save costs
    policy.saved(2, 10.0)
    policy.measured(stall=0.05, persist=0.5)  # an async save: a 50 ms staging copy
    assert policy.interval == pytest.approx(
        optimal_interval(Costs(ckpt_stall=0.05, mtbf=3600.0, persist=0.5))
    )
    assert policy.interval < 30.0
    assert policy.due(40, 10.0 + policy.interval)  # the next save comes that soon
    policy.saved(40, 10.0 + 86400.0)  # a day later, still no failure: the prior grows by that day
    policy.measured(stall=0.05, persist=0.5)
    assert policy.planned_mtbf == pytest.approx(3600.0 + 86400.0)
    assert policy.interval == pytest.approx(
        optimal_interval(Costs(ckpt_stall=0.05, mtbf=3600.0 + 86400.0, persist=0.5))
    )
    policy.observe_mtbf(1800.0)  # an observed failure rate replaces the prior (no growth any more)
    policy.saved(41, 10.0 + 2 * 86400.0)
    policy.measured(stall=0.05, persist=0.5)
    assert policy.interval == pytest.approx(
        optimal_interval(Costs(ckpt_stall=0.05, mtbf=1800.0, persist=0.5))
    )


def test_a_prior_from_the_fleet_s_failure_rate_still_applies_and_gpus_alone_warns() -> None:
    config = CheckpointConfig(root="/tmp/x", every="auto", gpus=16384, afr=0.05)
    assert config.prior_mtbf(world_size=8) == pytest.approx(365 * 86400 / (16384 * 0.05))
    with pytest.warns(UserWarning, match="gpus has no effect without afr"):
        CheckpointConfig(root="/tmp/x", gpus=64)
