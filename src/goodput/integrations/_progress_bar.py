"""Lightning's progress bar after a mid-epoch resume: the epoch start it was not shown.

Lightning's fit loop runs no ``on_train_epoch_start`` hook for the epoch it resumes in the middle of, and its
progress bars take their length and their "Epoch N" description in that hook: without it, a resumed bar reads
"Training 3/None" (``TQDMProgressBar``) or sizes the epoch from the step it resumed at, not from the step the
epoch began at ("3/1" for an epoch that ``max_steps`` cuts to 4 batches: ``RichProgressBar``).
:func:`show_epoch_start` gives the bar that hook, as it ran in the uninterrupted fit; the user's own hooks are
left as Lightning calls them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["show_epoch_start"]


def show_epoch_start(trainer: Any, pl_module: Any) -> None:
    """Run the trainer's progress bar's ``on_train_epoch_start`` as at the start of the current epoch.

    A bar sizes an epoch that ``max_steps`` cuts short as ``max_steps - global_step``; at the epoch's start that
    difference counted the steps this epoch has trained since, so the hook sees ``max_steps`` raised by them.
    """
    bar = trainer.progress_bar_callback
    if bar is None:
        return
    epoch_loop = trainer.fit_loop.epoch_loop
    shift = _steps_this_epoch(trainer) if epoch_loop.max_steps >= 0 else 0
    epoch_loop.max_steps += shift
    try:
        bar.on_train_epoch_start(trainer, pl_module)
    finally:
        epoch_loop.max_steps -= shift


def _steps_this_epoch(trainer: Any) -> int:
    """Optimizer steps taken in the current epoch: ``global_step``'s counter, reset at each epoch's start."""
    epoch_loop = trainer.fit_loop.epoch_loop
    if trainer.lightning_module.automatic_optimization:
        return int(epoch_loop.automatic_optimization.optim_progress.optimizer.step.current.completed)
    return int(epoch_loop.manual_optimization.optim_step_progress.current.completed)
