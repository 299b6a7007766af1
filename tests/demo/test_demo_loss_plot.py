"""The demo's loss plot keeps the curve readable when the guard rolled back a spike: its y range leaves the
spike out (it is marked at the top edge instead)."""

from __future__ import annotations

from goodput.demo.main import loss_range


def test_a_20x_spike_is_left_out_of_the_loss_plot_s_range() -> None:
    curve = [5.5 - 3.5 * i / 99 for i in range(100)]  # a falling loss, 5.5 to 2.0
    spike = 20 * curve[55]
    lo, hi = loss_range([*curve, spike, float("nan")])
    assert lo < 2.0 and 5.5 < hi < 6.0  # the whole curve, with a margin
    assert hi < spike
    assert loss_range(curve) == (lo, hi)  # the same range as without the spike
