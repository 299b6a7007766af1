"""The batch loop behind ``Run.batches``: epoch after epoch until the run's last step, the ledger's step start
before each batch is fetched, the hooks told of each iterator, epoch end and batch, and the loop started again
from the restored position after a rollback in place.

Kept apart from ``run.py`` so the Run holds the order of a step and this module the iteration's own state (the
iterator in use, maybe a background receiver's, and whether a hook rolled the run back).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from goodput.data.loader import ResumableLoader
from goodput.data.prefetch import DevicePrefetcher
from goodput.errors import ConfigError, DataError

if TYPE_CHECKING:
    from goodput.run.run import Run

__all__ = ["BatchLoop", "batch_source"]


class BatchLoop:
    """The iteration state of one ``Run``; ``rewound`` is set when a hook rolled the run back in place."""

    def __init__(self) -> None:
        self.ahead: Iterator[Any] | None = None  # what ``batches`` reads (maybe a receiving thread's)
        self.rewound = False  # a hook rolled the run back: ``batches`` iterates the loader again

    def batches(self, run: Run, loader: Any, steps: int | None, ahead: bool | None) -> Iterator[Any]:
        """``run``'s batches from ``loader`` until ``steps`` are done (see ``Run.batches``)."""
        self.stop()  # a previous iteration's thread must leave the loader before it is iterated again
        run.loader = loader
        for hook in run.hooks:
            hook.on_batches(run, loader)
        checkpointed = run.state is not None and run.state.loader is loader
        source = batch_source(loader, ahead, checkpointed=checkpointed)
        iterator = self._iterate(run, source, loader, first=True)
        pending = False  # a step_start was recorded and its batch not yet handed out
        empty_epochs = 0
        while steps is None or run.step < steps or self.loop_end_rewound(run):
            if self.rewound:  # rolled back in place: from the restored position
                self.rewound = False
                self.stop()
                iterator = self._iterate(run, source, loader, first=False)
            if not pending:
                run.ledger.step_start(run.step + 1)
                pending = True
            try:
                batch = next(iterator)
            except StopIteration:
                empty_epochs += 1
                if empty_epochs > 1:
                    raise DataError(
                        "the loader yields no batches: is the dataset smaller than a batch?"
                    ) from None
                for hook in run.hooks:
                    hook.on_epoch_end(run, loader)
                iterator = self._iterate(run, source, loader, first=False)  # the next epoch
                continue
            empty_epochs, pending = 0, False
            for hook in run.hooks:
                hook.on_batch(run, run.step + 1)
            yield batch

    def loop_end_rewound(self, run: Run, *, closing: bool = False) -> bool:
        """The loop reached its last step (``closing``: ``close()`` came first): whether a hook's verdict on the
        last steps rolled the run back, so ``batches`` goes on from the restored step."""
        for hook in run.hooks:
            if hook.on_loop_end(run, closing):
                self.rewound = True
                return True
        return False

    def _iterate(self, run: Run, source: Any, loader: Any, *, first: bool) -> Iterator[Any]:
        iterator = self.ahead = iter(source)
        for hook in run.hooks:
            hook.on_iterator(run, loader, first)
        return iterator

    def stop(self) -> None:
        """Stop the background receiver of the last ``batches()`` (it joins its thread; nothing is consumed)."""
        iterator, self.ahead = self.ahead, None
        close = getattr(iterator, "close", None)
        if callable(close):
            close()


def batch_source(loader: Any, ahead: bool | None, *, checkpointed: bool) -> Any:
    """What ``Run.batches`` iterates: ``loader``, or a thread receiving its batches ahead (see ``batches``).

    Raises:
        ConfigError: ``ahead=True`` with a loader other than a ``ResumableLoader`` whose position a checkpoint
            holds (``checkpointed``).
    """
    if ahead and not isinstance(loader, ResumableLoader) and checkpointed:
        raise ConfigError(
            f"batches(ahead=True) with a {type(loader).__name__} whose position the checkpoint holds: its "
            "state_dict() would count the batch received ahead as consumed, so a resume would skip it; use "
            "goodput.ResumableLoader (ahead counts only the batches the loop got) or ahead=False"
        )
    if ahead or (ahead is None and isinstance(loader, ResumableLoader) and loader.config.num_workers > 0):
        return DevicePrefetcher(loader, "cpu")
    return loader
