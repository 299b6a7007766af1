"""``RunHook``: what a part of a run does at each moment of ``Run``'s life, and nothing else.

``Run`` owns the order of a step (record it, fire faults, save); everything that watches or adjusts a run (the
watchdog, the crash-loop detector, the progress line, verify-resume's step records, the cache counters, the
numeric guard, the warm hand-over, the node-loss drill) is a hook in ``run.hooks``, called in list order at
each moment below. Every method has a no-op default, so a hook overrides only the moments it cares about, and
``run.add_hook(hook)`` appends one (an extension of a run, e.g. a straggler detector).

Moments, in the order a run meets them:

* ``before_restore(run, state)``: before the newest checkpoint is read; a hook that fills ``state`` itself
  (the warm hand-over from a surviving replica) returns its step and the checkpoint is not read.
* ``on_restore(run, state, step)``: the state is loaded (``step`` None: from scratch); ``run.step`` is set.
* ``on_batches(run, loader)``: ``run.batches`` starts reading ``loader``, before its first iterator.
* ``on_iterator(run, loader, first)``: a new iterator was made (the first, a next epoch, after a rollback).
* ``on_epoch_end(run, loader)``: the loader ran out of batches.
* ``on_batch(run, step)``: the batch of ``step`` was handed to the loop.
* ``adjust_loss(run, step, loss)``: before the ledger records the step's loss (a drill's numeric fault).
* ``on_step(run, step, loss)``: the step is recorded; True means the hook rolled the run back in place, so
  ``Run`` skips faults, preemption and saves for it, later hooks do not see it, and ``batches`` goes on from
  the restored position.
* ``on_loop_end(run, closing)``: ``run.batches`` reached its last step (``closing``: ``close()`` came before
  the loop's end); True means the hook rolled the run back, so the loop goes on (a hook may not roll back
  while closing: it raises instead).
* ``on_attempt(run, kind)``: a new ledger attempt opened in this process (``kind``: ``"warm"`` after a warm
  restart, ``"rollback"`` after a numeric rollback).
* ``on_fail(run)``: this rank failed and exits at once (warm restarts): write what must survive, no waiting.
* ``on_finish(run)``: ``close()`` saved the last step and it is durable.
* ``on_close(run, status)``: the run ends (``status``: ok, interrupted, failed): release what the hook holds;
  called in the reverse order, so a hook added last is closed first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from goodput.checkpoint.state import TrainingState
    from goodput.run.run import Run

__all__ = ["RunHook", "find_hook"]


class RunHook:
    """The protocol of a run's hooks, with a no-op default for every moment (see the module docstring)."""

    def before_restore(self, run: Run, state: TrainingState) -> int | None:
        """Fill ``state`` without a checkpoint and return its step, or None to let the checkpoint decide."""
        return None

    def on_restore(self, run: Run, state: TrainingState, step: int | None) -> None:
        """The state is loaded (``step`` None: the run starts from scratch)."""

    def on_batches(self, run: Run, loader: Any) -> None:
        """``run.batches`` starts reading ``loader`` (no iterator made yet)."""

    def on_iterator(self, run: Run, loader: Any, first: bool) -> None:
        """A new iterator of ``loader`` was made (``first``: the first of this ``batches`` call)."""

    def on_epoch_end(self, run: Run, loader: Any) -> None:
        """``loader`` ran out of batches (an epoch ended)."""

    def on_batch(self, run: Run, step: int) -> None:
        """The batch of ``step`` was handed to the training loop."""

    def adjust_loss(self, run: Run, step: int, loss: float | None) -> float | None:
        """The loss the ledger records for ``step`` (default: unchanged)."""
        return loss

    def on_step(self, run: Run, step: int, loss: float | None) -> bool:
        """``step`` finished and is recorded; True when this hook rolled the run back in place."""
        return False

    def on_loop_end(self, run: Run, closing: bool) -> bool:
        """The loop reached its last step; True when this hook rolled the run back (never while ``closing``)."""
        return False

    def on_attempt(self, run: Run, kind: str) -> None:
        """A new ledger attempt opened in this process (``"warm"`` or ``"rollback"``)."""

    def on_fail(self, run: Run) -> None:
        """This rank failed and exits now: keep what must survive (no collectives, no waiting)."""

    def on_finish(self, run: Run) -> None:
        """``close()``: the final step is saved and durable."""

    def on_close(self, run: Run, status: str) -> None:
        """The run ends with ``status`` (ok, interrupted, failed): release what this hook holds."""


H = TypeVar("H", bound=RunHook)


def find_hook(hooks: Iterable[RunHook], kind: type[H]) -> H | None:
    """The first of ``hooks`` that is a ``kind`` (None: the run has none): how ``Run`` and the other hooks reach
    the one part of a run they talk to (the watchdog's phases, the straggler detector's sections, the warm
    hand-over)."""
    return next((hook for hook in hooks if isinstance(hook, kind)), None)
