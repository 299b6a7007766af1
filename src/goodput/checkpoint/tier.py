"""The protocol every checkpoint tier implements, so :class:`CheckpointManager` holds a list of tiers.

A tier keeps whole training states somewhere (node-local RAM with a peer copy, a durable root) and answers for
them: save one step, restore the newest step it holds (no older than a floor the slower tiers already hold),
wait until its saves are done, close. The manager decides when each tier saves and which tier restores first;
a tier knows nothing of the others.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["CheckpointTier", "Restored"]


class Restored(Protocol):
    """Which step a tier restored, and from where (``tier``: for the ledger; ``source``: this rank's own)."""

    @property
    def step(self) -> int: ...

    @property
    def tier(self) -> str: ...

    @property
    def source(self) -> str: ...


class CheckpointTier(Protocol):
    """One place checkpoints live. Every rank makes the same calls in the same order."""

    name: str

    def save(self, step: int) -> object:
        """Save the training state as ``step``; returns what the save cost (the tier's own record of it)."""
        ...

    def restore(self, *, at_least: int | None = None, at_most: int | None = None) -> Restored | None:
        """Load the newest step this tier holds into the state, none older than ``at_least`` and none newer than
        ``at_most`` (a rollback); None when it holds none (the next tier is asked)."""
        ...

    def wait(self) -> object:
        """Block until the save in flight, if any, is done."""
        ...

    def close(self, *, finished: bool) -> None:
        """Wait for the last save and release the tier's threads (``finished``: the run is over)."""
        ...
