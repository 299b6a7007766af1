"""The report's model of a run with a memory tier (``goodput_covered``): Daly's model where every failure needs the
durable tier, and otherwise the work the memory tier's failures really lose, checked against the two-level Monte
Carlo simulation."""

from __future__ import annotations

import pytest

from goodput.errors import ConfigError
from goodput.planning import Costs, goodput_covered, goodput_daly
from goodput.planning.twolevel import TwoLevelCosts, simulate_two_level

COSTS = {"restart": 30.0, "persist": 10.0, "detect": 5.0}
DURABLE = Costs(ckpt_stall=5.0, mtbf=600.0, **COSTS)


def test_with_every_failure_needing_the_durable_tier_it_is_daly_s_model() -> None:
    for loss in (0.0, 50.0):
        covered = goodput_covered(200.0, DURABLE, durable_share=1.0, covered_loss=loss)
        assert covered == goodput_daly(200.0, DURABLE)


def test_a_failure_the_memory_tier_recovers_loses_only_its_own_work() -> None:
    """No failure reaches the durable tier: its saves cost their stall, each failure its covered loss and its
    restart, not half the durable interval."""
    covered = goodput_covered(200.0, DURABLE, durable_share=0.0, covered_loss=10.0)
    assert covered == pytest.approx(200.0 / 205.0 * (1.0 - (10.0 + 30.0 + 5.0) / 600.0), rel=1e-12)
    assert covered - goodput_daly(200.0, DURABLE) > 0.1  # Daly's charges 100 s + W a failure


@pytest.mark.parametrize(("share", "mtbf"), [(0.0, 600.0), (0.3, 600.0), (0.0, 3600.0), (1.0, 600.0)])
def test_it_agrees_with_the_two_level_simulation(share: float, mtbf: float) -> None:
    """Memory saves every 20 s with no cost, a durable one every 10th (C 5 s, W 10 s): a failure the memory tier
    recovers loses 10 s on average."""
    tau1, every = 20.0, 10
    costs = TwoLevelCosts(
        c1=0.0, w1=0.0, c2=5.0, w2=10.0, mtbf=mtbf, share=share, r1=30.0, r2=30.0, detect=5.0
    )
    simulated, error = simulate_two_level(costs, intervals=300, tau1=tau1, every=every, runs=150, seed=1)
    model = goodput_covered(
        tau1 * every, Costs(ckpt_stall=5.0, mtbf=mtbf, **COSTS), durable_share=share, covered_loss=tau1 / 2
    )
    assert model == pytest.approx(simulated, abs=max(0.01, 4 * error))


def test_bad_inputs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="durable share"):
        goodput_covered(200.0, Costs(ckpt_stall=5.0, mtbf=600.0), durable_share=1.5, covered_loss=0.0)
    with pytest.raises(ConfigError, match="covered_loss"):
        goodput_covered(200.0, Costs(ckpt_stall=5.0, mtbf=600.0), durable_share=0.5, covered_loss=-1.0)
