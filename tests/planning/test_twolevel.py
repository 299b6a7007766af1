"""The two-level (memory + durable) planner: its closed form against the single-level model and against a Monte
Carlo simulation, its optimum, and the ``goodput plan`` flags."""

from __future__ import annotations

import json

import pytest

from goodput.cli import main
from goodput.planning import Costs, goodput_first_order
from goodput.planning.twolevel import (
    TwoLevelCosts,
    durable_share,
    goodput_two_level,
    plan_two_level,
    simulate_two_level,
)

HOUR = 3600.0
COSTS = {"c1": 0.05, "w1": 0.5, "c2": 20.0, "w2": 120.0, "r1": 60.0, "r2": 120.0, "detect": 30.0}


def test_with_every_failure_needing_the_durable_tier_it_is_the_single_level_model() -> None:
    tau = 1800.0
    costs = TwoLevelCosts(c1=0.0, w1=0.0, c2=20.0, w2=120.0, mtbf=12 * HOUR, share=1.0, r2=120.0, detect=30.0)
    two = goodput_two_level(tau, tau, costs)
    one = goodput_first_order(
        tau, Costs(ckpt_stall=20.0, mtbf=12 * HOUR, restart=120.0, persist=120.0, detect=30.0)
    )
    assert two == pytest.approx(one, rel=1e-12)


def test_a_replica_covers_node_losses_unless_the_peer_is_lost_too() -> None:
    assert durable_share(0.3, replicated=False) == 0.3
    assert durable_share(0.3, replicated=True) == pytest.approx(0.09)


@pytest.mark.parametrize(("mtbf", "share"), [(12 * HOUR, 0.09), (HOUR, 0.3)])
def test_the_plan_is_a_local_optimum_and_beats_the_durable_tier_alone(mtbf: float, share: float) -> None:
    costs = TwoLevelCosts(mtbf=mtbf, share=share, **COSTS)
    plan = plan_two_level(costs)
    assert plan.goodput > plan.single_level_goodput
    assert plan.lost_work_per_failure < plan.single_level_lost_work_per_failure
    for factor in (0.7, 1.4):
        shifted = goodput_two_level(plan.memory_interval * factor, plan.durable_interval, costs)
        assert shifted < plan.goodput
        every = max(1, round(plan.durable_every * factor))
        if every != plan.durable_every:
            other = goodput_two_level(plan.memory_interval, every * plan.memory_interval, costs)
            assert other < plan.goodput


@pytest.mark.parametrize(("mtbf", "share"), [(12 * HOUR, 0.09), (HOUR, 0.3)])
def test_monte_carlo_agrees_with_the_closed_form(mtbf: float, share: float) -> None:
    costs = TwoLevelCosts(mtbf=mtbf, share=share, **COSTS)
    plan = plan_two_level(costs)
    intervals = round(7 * 24 * HOUR / plan.memory_interval)
    mean, stderr = simulate_two_level(
        costs, intervals=min(intervals, 20_000), tau1=plan.memory_interval, every=plan.durable_every, runs=200,
        seed=1,
    )  # fmt: skip
    # First order is exact up to terms in (tau/M)^2: within a point of goodput here.
    assert abs(mean - plan.goodput) < 0.01 + 3 * stderr, (mean, plan.goodput)


def test_plan_prints_and_returns_the_two_level_section(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--failures-per-day", "2", "--days", "30", "--ckpt-stall", "20s", "--persist", "2m",
            "--restart", "2m", "--memory-stall", "50ms", "--memory-persist", "0.5s", "--node-loss-share", "0.3"]  # fmt: skip
    assert main([*argv, "--json", "--simulate", "50"]) == 0
    section = json.loads(capsys.readouterr().out)["two_level"]
    assert section["durable_share"] == pytest.approx(0.09)
    assert section["goodput"] > section["single_level_goodput"]
    assert abs(section["simulated"]["goodput_mean"] - section["goodput"]) < 0.01
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "two-level" in text and "memory save every" in text and "with the durable tier alone" in text


def test_a_bad_node_loss_share_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["plan", "--failures-per-day", "2", "--days", "3", "--memory-stall", "50ms", "--node-loss-share", "2"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--node-loss-share must be between 0 and 1" in err and "Traceback" not in err
