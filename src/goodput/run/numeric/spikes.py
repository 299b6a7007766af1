"""What the numeric guard can see, in the ledger, so that a verdict on a run quotes the run's own figures:

* ``numeric_config`` (at each restore): the replica check's period, the spike rule's settings and the rollbacks
  the guard takes before it stops, which place a drill's faults where the guard can find and answer them;
* ``spike_rule`` (when the warm-up ends and every ``spike_warmup`` steps): the smallest rise, as a factor of the loss's current
  level, that the spike rule would catch now (``goodput report`` shows the latest);
* ``spike_missed``: a drill's ``spike`` fault that the rule did not call a spike, and why, with the loss the rule
  judged there (``loss``, the ranks' mean) beside its ``threshold``: a spiked loss at or below the threshold was
  not detectable by the rule as configured; one above it would be the guard's own fault.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from goodput.run.numeric.rules import spike_rise, spike_threshold

if TYPE_CHECKING:
    from goodput.run.numeric.config import NumericConfig

__all__ = ["WARMING_UP", "SpikeWatch"]

WARMING_UP = "the spike rule was warming up"  # how ``spike_missed`` says the rule did not apply yet


class SpikeWatch:
    """Writes the guard's figures (see the module docstring) to a run's ledger; decides nothing."""

    def __init__(self, config: NumericConfig) -> None:
        self.config = config
        self._spiked: dict[int, float] = {}  # step -> the factor a drill's spike applied to its loss

    def restored(self, ledger: Any) -> None:
        c = self.config
        ledger.event(
            "numeric_config", check_every=c.check_every, spike_k=c.spike_k, spike_window=c.spike_window,
            spike_warmup=c.spike_warmup, spike_min_rise=c.spike_min_rise, max_rollbacks=c.max_rollbacks,
            rollback_window=c.rollback_window,
        )  # fmt: skip

    def injected(self, step: int, factor: float | None) -> None:
        """A drill's spike multiplied the loss of ``step`` by ``factor`` (None: no spike at ``step``)."""
        if factor is not None:
            self._spiked[step] = factor

    def judged(
        self, run: Any, step: int, history: Sequence[float], spike: bool, loss: float | None = None
    ) -> None:
        """``step`` was judged after ``history`` (the rule's window); ``spike``: the verdict called it one;
        ``loss``: the loss it judged (the ranks' mean; None where no rank's was finite)."""
        ledger = run.ledger
        factor = self._spiked.pop(step, None)
        missed = factor is not None and not spike
        due = len(history) == self.config.spike_warmup or step % self.config.spike_warmup == 0
        if not (missed or due):
            return  # the figures cost as much as the verdict: computed only for an event
        figures = self.figures(history)
        if factor is not None and not spike:
            ledger.event(
                "spike_missed", step=step, factor=factor, why=self._why_missed(factor, history, loss, figures),
                loss=loss, **figures,
            )  # fmt: skip
        if figures and due:
            ledger.event("spike_rule", step=step, **figures)

    def figures(self, history: Sequence[float]) -> dict[str, float | None]:
        """``rise`` (a factor of the current level, None where the losses are not all positive) and
        ``threshold`` after ``history``; empty while the rule is off or warming up. Both are None where no float
        is above the threshold (a ``spike_k`` so large that it overflows): the ledger's JSON holds no infinity."""
        c = self.config
        if c.spike_k is None or len(history) < c.spike_warmup:
            return {}
        threshold = spike_threshold(history, k=c.spike_k, min_rise=c.spike_min_rise)
        if not math.isfinite(threshold):
            return {"rise": None, "threshold": None}
        return {"rise": spike_rise(history, k=c.spike_k, min_rise=c.spike_min_rise), "threshold": threshold}

    def _why_missed(
        self, factor: float, history: Sequence[float], loss: float | None, figures: dict[str, float | None]
    ) -> str:
        """Why the spike at ``factor`` went unseen, from ``figures`` (:meth:`figures` of ``history``)."""
        c = self.config
        if c.spike_k is None:
            return "the spike rule is off (NumericConfig(spike_k=None))"
        if len(history) < c.spike_warmup:
            return f"{WARMING_UP} ({len(history)} of spike_warmup={c.spike_warmup} steps)"
        rise, threshold = figures.get("rise"), figures.get("threshold")
        needs = f"a rise of {rise:.1f}x over its level" if rise is not None else "a larger rise"
        below = (
            f"took the loss to {loss:.4g}, not above the spike rule's threshold {threshold:.4g}"
            if loss is not None and threshold is not None
            else "stayed below the spike rule's threshold"
        )
        return (
            f"a {factor:g}x spike {below}: on this loss it needs {needs} "
            "(spike_k x the spread of the loss's own rises over the steps before them)"
        )
