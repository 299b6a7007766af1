"""No false alarm over a long run of the drill's demo (``src/goodput/drill/demo_train.py``, 2 ranks, 5,400 steps):
a mean of squared errors over 16 samples under dropout, whose ordinary steps, once it has converged, rise to
10-15x the level of the steps before them a few times in a run (one hard sample in a batch; the next step is
back to the level).

The curve is recorded (``tests/fixtures/numeric/drill_demo_loss.json``: each step's mean loss over the ranks, from
a run whose spike rule could not fire, so every step is the clean one). A rule whose noise was a MAD (which leaves
the tail out) called steps 372, 2155 and 3476 of this curve spikes at the default ``spike_k``, and the three
rollbacks within 1,000 steps stopped the job.
"""

from __future__ import annotations

import math
import statistics

from goodput.run.numeric import NumericConfig
from goodput.run.numeric.rules import RECENT, spike_threshold
from tests.helpers.numeric import recorded_losses, replay_alarms


def _losses() -> list[float]:
    return recorded_losses("drill_demo_loss.json", 5400)


def test_no_false_spike_over_a_long_run_of_the_drill_s_demo_from_its_start_or_a_relaunch() -> None:
    losses = _losses()
    alarms = {start: replay_alarms(losses, start, NumericConfig()) for start in range(0, 5400, 600)}
    assert {s: a for s, a in alarms.items() if a} == {}


def test_the_threshold_stands_above_every_ordinary_step_and_below_a_100x_spike_at_most_steps() -> None:
    """The margins over that run, the window full: no ordinary step rises more than 0.85 of the threshold's rise
    (both in factors over the level); a 100x spike is caught at nine in ten steps, a 50x one at two in three. A
    spike is missed where the step's own loss is low: 50x a step at a third of the level is within the loss's
    ordinary tail (rises of 10-15x), and there the rule needs more (``spike_rule`` in the ledger says how much)."""
    losses = _losses()
    worst = 0.0
    for at in range(100, 5400):
        window = losses[at - 100 : at]
        level = statistics.median(math.log(x) for x in window[-RECENT:])
        limit = math.log(spike_threshold(window, k=6.0, min_rise=0.1)) - level
        worst = max(worst, (math.log(losses[at]) - level) / limit)
    assert 0.5 < worst < 0.85
    config = NumericConfig()
    for factor, share in ((100, 0.85), (50, 0.6)):
        caught = [replay_alarms([*losses[at - 100 : at], factor * losses[at]], 0, config) == [100] for at in range(100, 5400, 50)]  # fmt: skip
        assert sum(caught) >= share * len(caught), (factor, sum(caught), len(caught))
