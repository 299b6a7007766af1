"""The straggler scores and alarm rules (pure: per-rank window medians in, verdicts out)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from goodput.run.stragglers.rules import RankWindow, StragglerConfig, StragglerRules


def _windows(owns: list[float], *, data: list[float] | None = None, steps: int = 5) -> list[RankWindow]:
    data = data or [0.0] * len(owns)
    return [RankWindow(compute=o, data=d, wait=0.0, steps=steps) for o, d in zip(owns, data, strict=True)]


def test_a_rank_slow_for_k_windows_raises_one_alarm_naming_it_and_compute() -> None:
    rules = StragglerRules(StragglerConfig(every=5, windows=3), world_size=3)
    verdicts = [rules.window(_windows([0.010, 0.015, 0.010])) for _ in range(5)]
    assert [v.alarm for v in verdicts] == [None, None, 1, None, None]  # once, at the third slow window
    assert verdicts[2].kind == "compute"
    assert verdicts[0].scores[1] == pytest.approx(0.010 / 0.015, abs=1e-9)
    assert verdicts[0].scores[0] == verdicts[0].scores[2] == 1.0
    assert verdicts[0].slowest == 1


def test_the_cost_is_the_slowest_ranks_excess_over_the_median_of_the_others_per_step() -> None:
    rules = StragglerRules(StragglerConfig(), world_size=3)
    verdict = rules.window(_windows([0.010, 0.016, 0.012], steps=5))
    assert verdict.cost_seconds == pytest.approx((0.016 - 0.011) * 5)
    two = StragglerRules(StragglerConfig(), world_size=2).window(_windows([0.010, 0.015], steps=4))
    assert two.cost_seconds == pytest.approx(0.005 * 4)  # 2 ranks: the other one is the balanced step


def test_a_slow_batch_wait_is_named_data() -> None:
    rules = StragglerRules(StragglerConfig(windows=1), world_size=2)
    verdict = rules.window(_windows([0.010, 0.010], data=[0.0005, 0.0060]))
    assert (verdict.alarm, verdict.kind) == (1, "data")


def test_one_slow_window_between_fast_ones_restarts_the_count() -> None:
    rules = StragglerRules(StragglerConfig(windows=2), world_size=2)
    alarms = [rules.window(_windows(owns)).alarm for owns in ([0.01, 0.02], [0.01, 0.01], [0.01, 0.02])]
    assert alarms == [None, None, None]
    assert rules.window(_windows([0.01, 0.02])).alarm == 1


def test_an_excess_under_min_excess_is_noise_on_a_short_step() -> None:
    rules = StragglerRules(StragglerConfig(windows=1, min_excess=0.002), world_size=2)
    assert rules.window(_windows([0.0010, 0.0020])).alarm is None  # half the speed, but only 1 ms


def test_the_individual_score_compares_a_rank_with_its_own_best() -> None:
    rules = StragglerRules(StragglerConfig(), world_size=2)
    rules.window(_windows([0.010, 0.010]))
    verdict = rules.window(_windows([0.020, 0.020]))  # both slowed: relative 1.0, individual 0.5
    assert verdict.scores == (1.0, 1.0)
    assert verdict.best_scores == pytest.approx((0.5, 0.5))
    assert verdict.alarm is None


def test_noisy_clean_windows_raise_no_alarm_with_the_defaults() -> None:
    """Medians of 5 steps of a 10 ms step where one step in four is descheduled for up to 3x: no alarm."""
    rng = random.Random(0)
    config = StragglerConfig()
    rules = StragglerRules(config, world_size=3)
    for _ in range(2000):
        owns = []
        for _rank in range(3):
            steps = [0.010 * (rng.uniform(1.0, 3.0) if rng.random() < 0.25 else rng.uniform(0.9, 1.1))]
            steps += [0.010 * (rng.uniform(1.0, 3.0) if rng.random() < 0.25 else rng.uniform(0.9, 1.1))]
            steps += [0.010 * rng.uniform(0.9, 1.1) for _ in range(config.every - 2)]
            owns.append(sorted(steps)[config.every // 2])
        assert rules.window(_windows(owns)).alarm is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("every", 0), ("threshold", 1.0), ("threshold", 0.0), ("windows", 0), ("min_excess", -1.0)],
)
def test_a_bad_setting_names_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"StragglerConfig.{field}"):
        StragglerConfig(**{field: value})  # type: ignore[arg-type]


def test_stop_and_replace_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="stop=True and replace=True"):
        StragglerConfig(stop=True, replace=True)


def test_the_scores_compare_each_ranks_lowest_step_so_noise_on_the_fast_rank_hides_no_straggler() -> None:
    """Noise only adds time: the fast rank's median compute is inflated (a wait its hooks did not see), its
    lowest is not. Scored on medians the slow rank would look fine (0.0185 / 0.0190); on the lowest compute plus
    the batch wait it is slow, and its excess is in its data."""
    rules = StragglerRules(StragglerConfig(windows=1), world_size=2)
    noisy_fast = RankWindow(compute=0.0185, data=0.0, wait=0.0, steps=5, floor=0.0125)
    slow = RankWindow(compute=0.0125, data=0.0065, wait=0.0, steps=5, floor=0.0120)
    verdict = rules.window([noisy_fast, slow])
    assert verdict.scores[1] == pytest.approx(0.0125 / (0.0120 + 0.0065))
    assert (verdict.alarm, verdict.kind) == (1, "data")
    medians_only = StragglerRules(StragglerConfig(windows=1), world_size=2).window(
        [dataclasses.replace(w, floor=None) for w in (noisy_fast, slow)]
    )
    assert medians_only.alarm is None
