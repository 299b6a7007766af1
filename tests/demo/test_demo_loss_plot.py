"""The demo's loss plot keeps the curve readable when the guard rolled back a spike: its y range leaves the
spike out (it is marked at the top edge instead)."""

from __future__ import annotations

from goodput.demo.main import loss_history, loss_range


def test_a_20x_spike_is_left_out_of_the_loss_plot_s_range() -> None:
    curve = [5.5 - 3.5 * i / 99 for i in range(100)]  # a falling loss, 5.5 to 2.0
    spike = 20 * curve[55]
    lo, hi = loss_range([*curve, spike, float("nan")])
    assert lo < 2.0 and 5.5 < hi < 6.0  # the whole curve, with a margin
    assert hi < spike
    assert loss_range(curve) == (lo, hi)  # the same range as without the spike


def test_a_spike_redone_twice_stays_in_the_loss_history() -> None:
    """Rolled back twice from step 3: the spike and the first redo's value are both kept, beside the last."""
    values = [(1, 2.0), (2, 1.9), (3, 40.0), (3, 1.85), (3, 1.8), (4, 1.7)]
    losses, redone = loss_history([{"event": "step_end", "step": s, "loss": v} for s, v in values])
    assert losses == {1: 2.0, 2: 1.9, 3: 1.8, 4: 1.7}
    assert redone == [(3, 40.0), (3, 1.85)]
