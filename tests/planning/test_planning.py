"""The planner's closed forms against hand-worked values, their properties, and the Monte Carlo cross-check."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput import ConfigError, PlanInputs, goodput_daly, optimal_interval, simulate_goodput, young_interval
from goodput.planning import (
    Costs,
    daily_waste,
    daly_interval,
    goodput_first_order,
    lost_work_per_failure,
    mtbf_seconds,
    waste_per_failure,
)
from goodput.planning.model import daly_expected_time, failure_probability, mtbf_from_rate

HOUR = 3600.0
DAY = 86400.0
LN2 = math.log(2.0)


# ---------------------------------------------------------------- hand-worked values


def test_failure_probability_of_the_issue_example() -> None:
    # 1024 GPUs * 0.01/yr * 30 d / 365 = 307.2 / 365 = 0.841644 expected failures;
    # e^-0.84 = 0.431711, e^-0.001644 = 0.998357, product 0.431002, so P = 1 - 0.431002 = 0.568998 (57%).
    assert failure_probability(1024, 0.01, 30) == pytest.approx(0.568998, abs=2e-6)


def test_failure_probability_edges() -> None:
    # One expected failure: 365 GPUs * 1/365... use 100 GPUs, afr 0.365, 10 days -> 100*0.365*10/365 = 1.0.
    assert failure_probability(100, 0.365, 10) == pytest.approx(1 - 1 / math.e, rel=1e-12)
    assert failure_probability(1, 0.01, 0) == 0.0


def test_mtbf_from_gpus_and_from_an_observed_rate() -> None:
    # 365 d * 86400 s = 31,536,000 s per device-year; 1024 * 0.01 = 10.24 failures/yr -> 3,079,687.5 s = 855.47 h.
    assert mtbf_seconds(1024, 0.01) == pytest.approx(3_079_687.5, rel=1e-12)
    # 8.6 failures a day: 86400 / 8.6 = 10046.51 s between failures.
    assert mtbf_from_rate(8.6) == pytest.approx(10_046.5116, rel=1e-8)


def test_waste_per_failure_and_lost_work() -> None:
    # 1 h interval: half of it (1800 s) plus persist 90 s is lost; plus restart 600 s and detect 120 s.
    assert lost_work_per_failure(3600, persist=90) == 1890
    assert waste_per_failure(3600, restart=600, persist=90, detect=120) == 2610


def test_issue_anchor_8_6_failures_a_day_2h_interval_is_64_percent() -> None:
    # Free checkpoints and restarts: each failure loses 1 h; 8.6 a day waste 8.6 h of 24 -> 1 - 8.6/24 = 0.641667.
    mtbf = mtbf_from_rate(8.6)
    assert daily_waste(2 * HOUR, Costs(ckpt_stall=0.0, mtbf=mtbf)) == pytest.approx(8.6 * HOUR, rel=1e-12)
    assert goodput_first_order(2 * HOUR, Costs(ckpt_stall=0.0, mtbf=mtbf)) == pytest.approx(
        0.641667, abs=1e-6
    )


def test_first_order_goodput_with_every_cost() -> None:
    # tau 1 h, C 60 s, R 600 s, D 120 s, W 180 s, M 10 h: C/tau = 60/3600 = 0.016667;
    # (600 + 120 + 1800 + 180) / 36000 = 2700/36000 = 0.075; G = 1 - 0.016667 - 0.075 = 0.908333.
    costs = Costs(ckpt_stall=60, mtbf=36000, restart=600, detect=120, persist=180)
    g = goodput_first_order(3600, costs)
    assert g == pytest.approx(0.908333, abs=1e-6)
    # Daily waste = 86400 * (0.016667 + 0.075) = 1440 + 6480 = 7920 s.
    assert daily_waste(3600, costs) == pytest.approx(7920, rel=1e-12)


def test_daly_goodput_hand_worked() -> None:
    # Pick tau + C = M ln 2, so exp((tau + C)/M) - 1 = 1 and one segment takes M * e^(R'/M) in expectation.
    # M = 1 h, C = 0: tau = 3600 ln 2 = 2495.3 s, segment 3600 s, goodput = ln 2 = 0.693147.
    tau = HOUR * LN2
    assert goodput_daly(tau, Costs(ckpt_stall=0.0, mtbf=HOUR)) == pytest.approx(LN2, rel=1e-12)
    # R' = R + D + W = 3600 ln 2 (1200 ln 2 each; W < tau so no wait): factor e^(ln 2) = 2, goodput ln2 / 2.
    third = 1200 * LN2
    costs = Costs(ckpt_stall=0.0, mtbf=HOUR, restart=third, detect=third, persist=third)
    assert goodput_daly(tau, costs) == pytest.approx(LN2 / 2)
    # Ten such intervals take ten segments: 36000 s * 2.
    assert daly_expected_time(10 * tau, tau, costs) == pytest.approx(72_000, rel=1e-12)


def test_daly_goodput_of_the_issue_anchor() -> None:
    # 2 h against M = 86400/8.6: tau/M = 7200*8.6/86400 = 0.716667; e^0.7 = 2.013753, e^0.016667 = 1.016806,
    # so e^0.716667 - 1 = 1.047597 and goodput = 0.716667 / 1.047597 = 0.684105 (first order says 0.6417).
    assert goodput_daly(2 * HOUR, Costs(ckpt_stall=0.0, mtbf=mtbf_from_rate(8.6))) == pytest.approx(
        0.684105, abs=2e-6
    )


def test_daly_waits_for_the_previous_save_when_the_interval_is_shorter_than_persist() -> None:
    # tau 60 s, W 100 s: every checkpoint waits 40 s more, so the stall is C + 40 s. With M huge the
    # goodput tends to tau / (tau + C + 40) = 60 / 110 for C = 10.
    costs = Costs(ckpt_stall=10, mtbf=1e12, persist=100)
    assert goodput_daly(60, costs) == pytest.approx(60 / 110, rel=1e-6)
    # First order charges the same wait: 1 - (10 + 40)/60 = 1/6 when failures are negligible.
    assert goodput_first_order(60, costs) == pytest.approx(1 / 6, rel=1e-6)


def test_young_and_daly_intervals_hand_worked() -> None:
    # C 50 s, M 10000 s: Young sqrt(2*50*10000) = sqrt(1e6) = 1000 s.
    assert young_interval(50, 10_000) == pytest.approx(1000, rel=1e-12)
    # Daly: C/2M = 0.0025, sqrt = 0.05; 1000 * (1 + 0.05/3 + 0.0025/9) - 50 = 1016.9444 - 50 = 966.9444.
    assert daly_interval(50, 10_000) == pytest.approx(966.9444, abs=1e-4)
    # C >= 2M: Daly says checkpoint every M.
    assert daly_interval(3.0, 1.0) == 1.0


def test_exact_optimum_hand_worked() -> None:
    # Setting d/dtau [(e^((tau+C)/M) - 1) / tau] = 0 gives e^(u+c) (1 - u) = 1 with u = tau/M, c = C/M.
    # Choose u = 1/2: e^(1/2 + c) = 2 -> c = ln 2 - 1/2 = 0.193147. With M = 1 h: C = 695.33 s, optimum 1800 s.
    assert optimal_interval(Costs(ckpt_stall=HOUR * (LN2 - 0.5), mtbf=HOUR)) == pytest.approx(1800, rel=1e-6)


def test_optimum_is_never_shorter_than_persist() -> None:
    # Young here is sqrt(2 * 10 * 1e6) = 4472 s, but a save takes 1e5 s to persist.
    assert optimal_interval(Costs(ckpt_stall=10, mtbf=1e6, persist=1e5)) == pytest.approx(1e5)
    # No stall, no persist: checkpoint as often as possible.
    assert optimal_interval(Costs(ckpt_stall=0.0, mtbf=1e6)) == 0.0
    assert optimal_interval(Costs(ckpt_stall=0.0, mtbf=1e6, persist=30)) == 30


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"mtbf": 0.0}, "mtbf"), ({"mtbf": -5.0}, "mtbf"), ({"ckpt_stall": -1.0}, "ckpt_stall"),
     ({"persist": math.nan}, "persist")],
)  # fmt: skip
def test_optimal_interval_refuses_nonsense(kwargs: dict[str, float], field: str) -> None:
    args = {"ckpt_stall": 10.0, "mtbf": 3600.0} | kwargs
    with pytest.raises(ConfigError, match=field):
        optimal_interval(Costs(**args))


def test_optimal_interval_without_failures_is_never() -> None:
    assert optimal_interval(Costs(ckpt_stall=10.0, mtbf=math.inf)) == math.inf


# ---------------------------------------------------------------- properties

positive_counts = st.integers(min_value=1, max_value=100_000)
afrs = st.floats(min_value=1e-4, max_value=0.99)
days = st.floats(min_value=0.01, max_value=365)
stall_ratio = st.floats(min_value=1e-6, max_value=0.5)
mtbfs = st.floats(min_value=60.0, max_value=1e8)


@given(positive_counts, positive_counts, afrs, days)
def test_failure_probability_grows_with_gpus(a: int, b: int, afr: float, d: float) -> None:
    low, high = sorted((a, b))
    assert failure_probability(low, afr, d) <= failure_probability(high, afr, d)
    assert 0.0 <= failure_probability(low, afr, d) <= 1.0


@given(positive_counts, afrs, afrs, days, days)
def test_failure_probability_grows_with_afr_and_days(
    g: int, a1: float, a2: float, d1: float, d2: float
) -> None:
    low_afr, high_afr = sorted((a1, a2))
    low_d, high_d = sorted((d1, d2))
    assert failure_probability(g, low_afr, d1) <= failure_probability(g, high_afr, d1)
    assert failure_probability(g, a1, low_d) <= failure_probability(g, a1, high_d)


@given(
    st.floats(min_value=1.0, max_value=1e5),
    st.floats(min_value=0.0, max_value=1e4),
    st.floats(min_value=0.0, max_value=1e4),
    st.floats(min_value=0.0, max_value=1e4),
    mtbfs,
)
def test_goodput_falls_as_checkpoint_and_restart_cost_more(
    tau: float, c: float, r: float, extra: float, mtbf: float
) -> None:
    costs = Costs(ckpt_stall=c, mtbf=mtbf, restart=r)
    for model in (goodput_daly, goodput_first_order):
        assert model(tau, replace(costs, ckpt_stall=c + extra)) <= model(tau, costs)
        assert model(tau, replace(costs, restart=r + extra)) <= model(tau, costs)
    assert 0.0 <= goodput_daly(tau, costs) < 1.0


@settings(max_examples=60, deadline=None)
@given(stall_ratio, mtbfs, st.floats(min_value=0.0, max_value=2.0))
def test_exact_optimum_minimises_the_model(ratio: float, mtbf: float, persist_ratio: float) -> None:
    c = ratio * mtbf
    persist = persist_ratio * young_interval(c, mtbf)
    costs = Costs(ckpt_stall=c, mtbf=mtbf, restart=0.1 * mtbf, persist=persist)
    best = optimal_interval(costs)
    assert best >= persist

    def g(tau: float) -> float:
        return goodput_daly(tau, costs)

    top = g(best)
    grid = np.geomspace(persist if persist > 0 else mtbf * 1e-6, 5 * mtbf, 3000)
    assert top >= max(g(float(t)) for t in grid) - 1e-12
    for step in (1.001, 1.01, 1.1):
        assert top >= g(best * step) - 1e-12
        if best / step >= persist:
            assert top >= g(best / step) - 1e-12


@given(st.floats(min_value=1e-7, max_value=1e-2), mtbfs)
def test_young_daly_and_exact_agree_when_checkpoints_are_cheap(ratio: float, mtbf: float) -> None:
    # Daly / Young = 1 - (2/3) sqrt(C/2M) + (C/2M)/9: they part by about sqrt(C/2M).
    c = ratio * mtbf
    young, daly = young_interval(c, mtbf), daly_interval(c, mtbf)
    exact = optimal_interval(Costs(ckpt_stall=c, mtbf=mtbf))
    assert abs(daly / young - 1) <= math.sqrt(c / (2 * mtbf))
    assert abs(exact / young - 1) <= math.sqrt(c / mtbf)
    assert abs(exact / daly - 1) <= 1e-3


# ---------------------------------------------------------------- the config dataclass


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"days": 30, "gpus": -5, "afr": 0.01}, "gpus"),
        ({"days": 30, "gpus": 0, "afr": 0.01}, "gpus"),
        ({"days": 30, "gpus": 8, "afr": 1.5}, "afr"),
        ({"days": 30, "gpus": 8, "afr": 0.0}, "afr"),
        ({"days": 30, "gpus": 8}, "afr"),
        ({"days": 30, "failures_per_day": 2.0, "gpus": 8}, "failures_per_day"),
        ({"days": 30, "failures_per_day": -1.0}, "failures_per_day"),
        ({"days": 0, "failures_per_day": 1.0}, "days"),
        ({"days": 30, "failures_per_day": 1.0, "ckpt_stall": -1.0}, "ckpt_stall"),
        ({"days": 30, "failures_per_day": 1.0, "restart": float("nan")}, "restart"),
    ],
)
def test_plan_inputs_refuse_bad_values_naming_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        PlanInputs(**kwargs)  # type: ignore[arg-type]


def test_plan_inputs_mtbf_and_probability() -> None:
    job = PlanInputs(days=30, gpus=1024, afr=0.01)
    assert job.mtbf == pytest.approx(3_079_687.5)
    assert job.failure_probability == pytest.approx(0.568998, abs=2e-6)
    # 2 failures a day for 1 day: P = 1 - e^-2 = 0.864665.
    assert PlanInputs(days=1, failures_per_day=2).failure_probability == pytest.approx(0.864665, abs=1e-6)


# ---------------------------------------------------------------- the simulator against the closed forms


@pytest.mark.parametrize(
    ("tau", "stall", "mtbf", "restart", "detect", "persist"),
    [
        (3600, 120, 10 * HOUR, 600, 60, 0),  # Daly's model is exact for this job
        (1800, 0, 2 * HOUR, 0, 0, 0),  # failures every few intervals, free checkpoints
        (
            3600,
            120,
            20 * HOUR,
            600,
            60,
            300,
        ),  # async save: W << tau << M, the closed form charges W per failure
    ],
)
def test_simulated_wall_time_matches_daly(
    tau: float, stall: float, mtbf: float, restart: float, detect: float, persist: float
) -> None:
    costs = Costs(ckpt_stall=stall, mtbf=mtbf, restart=restart, detect=detect, persist=persist)
    sim = simulate_goodput(costs, intervals=60, interval=tau, runs=4000, seed=7)
    expected = daly_expected_time(60 * tau, tau, costs)
    assert abs(sim.wall_mean - expected) <= 4 * sim.wall_stderr
    assert sim.failures_mean > 1  # the check means something only if failures happen
    assert sim.goodput_p5 <= sim.goodput_p50 <= sim.goodput_p95


def test_simulation_confirms_the_exact_model_not_the_first_order_one_at_high_failure_rates() -> None:
    # The issue's anchor: 8.6 failures a day, 2 h intervals, no costs. Daly says 68.41%, first order 64.17%.
    mtbf = mtbf_from_rate(8.6)
    costs = Costs(ckpt_stall=0, mtbf=mtbf)
    sim = simulate_goodput(costs, intervals=100, interval=2 * HOUR, runs=2000, seed=3)
    daly = goodput_daly(2 * HOUR, costs)
    expected_wall = daly_expected_time(100 * 2 * HOUR, 2 * HOUR, costs)
    assert abs(sim.wall_mean - expected_wall) <= 4 * sim.wall_stderr
    assert abs(sim.goodput_mean - daly) < 0.01
    assert sim.goodput_mean - goodput_first_order(2 * HOUR, costs) > 0.03


def test_simulation_without_failures_is_the_schedule() -> None:
    # tau 60 s, stall 5 s, persist 100 s, 3 intervals, no failures (M = 1e15 s): the first checkpoint ends at 65 s,
    # each later one waits for the previous save (period max(60, 100) + 5 = 105 s): 65 + 2 * 105 = 275 s.
    costs = Costs(ckpt_stall=5, persist=100, mtbf=1e15)
    sim = simulate_goodput(costs, intervals=3, interval=60, runs=10, seed=0)
    assert sim.wall_mean == pytest.approx(275)
    assert sim.goodput_mean == pytest.approx(180 / 275)
    assert sim.failures_mean == 0


def test_simulation_is_reproducible_by_seed() -> None:
    costs = Costs(ckpt_stall=10.0, mtbf=3600.0, restart=60.0)
    kwargs = {"intervals": 20, "interval": 600.0, "runs": 200}
    assert simulate_goodput(costs, seed=5, **kwargs) == simulate_goodput(costs, seed=5, **kwargs)  # type: ignore[arg-type]
    assert simulate_goodput(costs, seed=5, **kwargs) != simulate_goodput(costs, seed=6, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        {"intervals": 0},
        {"runs": 1},
        {"interval": 0.0},
        {"mtbf": -1.0},
        {"persist": -1.0},
        {"restart": math.inf},
    ],
)
def test_simulation_refuses_bad_inputs(bad: dict[str, float]) -> None:
    kwargs = {"intervals": 5, "interval": 60.0, "ckpt_stall": 1.0, "mtbf": 600.0, "runs": 10} | bad
    costs = Costs(**{k: kwargs.pop(k) for k in ("ckpt_stall", "mtbf", "restart", "persist") if k in kwargs})
    with pytest.raises(ConfigError, match=next(iter(bad))):
        simulate_goodput(costs, **kwargs)  # type: ignore[arg-type]


def test_simulation_refuses_a_job_that_never_finishes() -> None:
    # An interval 100 times the MTBF gets through with probability e^-100: the job would never end.
    with pytest.raises(ConfigError, match="never"):
        simulate_goodput(Costs(ckpt_stall=0, mtbf=HOUR), intervals=2, interval=100 * HOUR, runs=2)
