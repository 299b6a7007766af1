"""A ResumableLoader as a framework's loop iterates it: the position after each delivered batch, the fetch wait.

Frameworks fetch ahead of the step they run (Lightning one batch, accelerate one batch to spot the last), so the
loader's live position is past the step being saved. :class:`TrackedLoader` remembers the position right after
every delivered batch, and the batch's dataset indices; the integration tells it how many batches each step
trained (:meth:`~TrackedLoader.step_trained`), ``state_dict()`` answers with the position after exactly those,
and ``last_indices`` with the indices of the latest step's batches (what ``goodput verify-resume`` compares).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from goodput.errors import CheckpointError, ConfigError

__all__ = ["TrackedLoader"]


class TrackedLoader:
    """A :class:`~goodput.data.ResumableLoader` as Lightning iterates it, with the position after each batch.

    ``len()`` is the loader's batches per epoch, so Lightning's ``is_last_batch`` stays right after a mid-epoch
    resume (the restored iterator yields only the epoch's remaining batches).
    """

    def __init__(self, loader: Any, *, keep: int = 16) -> None:
        if not (
            callable(getattr(loader, "state_dict", None))
            and callable(getattr(loader, "load_state_dict", None))
        ):
            raise ConfigError(
                "GoodputCallback needs a loader with state_dict()/load_state_dict(): a ResumableLoader"
            )
        self.loader = loader
        self.delivered = 0  # batches handed to Lightning in this process
        self.trained = 0  # batches whose training step ended in this process (the callback counts them)
        # (count, position after the batch, its dataset indices) of the latest delivered batches
        self._positions: collections.deque[tuple[int, dict[str, Any], Any]] = collections.deque(maxlen=keep)
        self._step_batches = 0  # batches the latest step trained
        self._waited = 0.0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.loader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                if self._positions:  # the epoch is over: after its last batch comes the next epoch's start
                    count, _, indices = self._positions[-1]
                    self._positions[-1] = (count, self.loader.state_dict(), indices)
                return
            self._waited += time.perf_counter() - start
            self.delivered += 1
            indices = getattr(self.loader, "last_indices", None)
            self._positions.append((self.delivered, self.loader.state_dict(), indices))
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` unless the position is already in it (keeps a restored mid-epoch position)."""
        self.loader.set_epoch(epoch)

    def step_trained(self, batches: int = 1) -> None:
        """A training step ended that trained the next ``batches`` delivered batches."""
        self.trained += batches
        self._step_batches = batches

    @property
    def last_indices(self) -> Any:
        """The dataset indices of the latest step's batches, in order (None: the loader does not know them)."""
        first = self.trained - self._step_batches
        parts = [i for count, _, i in self._positions if first < count <= self.trained]
        if self._step_batches == 0 or len(parts) != self._step_batches or any(i is None for i in parts):
            return None
        return np.concatenate(parts)

    def take_wait(self) -> float:
        """Seconds spent waiting for batches since the previous call (the step's fetch time)."""
        waited, self._waited = self._waited, 0.0
        return waited

    def state_dict(self) -> dict[str, Any]:
        """The position after the last trained batch (not the batch Lightning prefetched past it)."""
        for count, position, _ in reversed(self._positions):
            if count == self.trained:
                return position
        if self.trained == 0:
            return self.loader.state_dict()
        raise CheckpointError(
            f"the data position after batch {self.trained} is no longer known ({self.delivered} delivered)"
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
        self._positions.clear()
        self.delivered = self.trained = self._step_batches = 0
