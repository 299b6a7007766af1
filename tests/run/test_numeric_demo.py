"""No false alarm over the demo's run: the spike verdict replayed over the loss of ``goodput demo`` (2 ranks, its
default 2,000 steps, the guard on), from the start and from relaunches along it.

The curve is recorded (``tests/fixtures/numeric/demo_loss.json``: each step's mean loss over the ranks as last
trained, from the ledger of a default run: its drilled steps were redone clean and the skipped window's steps
trained the next samples, so it is the loss of a clean run that skipped those samples). The run itself takes
minutes, the replay seconds. That run found its four drilled faults and nothing else.
"""

from __future__ import annotations

from goodput.run.numeric import NumericConfig
from tests.helpers.numeric import recorded_losses, replay_alarms


def _losses() -> list[float]:
    return recorded_losses("demo_loss.json", 2000)


def test_no_false_spike_over_the_demo_s_run_from_any_of_its_relaunches() -> None:
    losses = _losses()
    config = NumericConfig()
    alarms = {start: replay_alarms(losses, start, config) for start in range(0, 1950, 50)}
    assert {s: a for s, a in alarms.items() if a} == {}


def test_the_demo_s_drilled_spike_stands_far_above_its_threshold() -> None:
    """The demo's 20x spike (at 55% of the steps) is found with room to spare: the threshold there is a rise of a
    few tens of percent of the window's median, not of 20x."""
    losses = _losses()
    at = 1100
    window = losses[at - 100 : at]
    flagged = replay_alarms([*window, losses[at] * 20], 0, NumericConfig())
    assert flagged == [100]
    assert replay_alarms([*window, losses[at] * 2], 0, NumericConfig()) == [100]
