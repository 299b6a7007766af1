"""The protocol every checkpoint tier implements, so :class:`CheckpointManager` holds a list of tiers.

A tier keeps whole training states somewhere (node-local RAM with a peer copy, a durable root) and answers for
them: save one step, list and restore the newest step it holds, wait until its saves are done, close. Each tier
carries its own cadence (:class:`Cadence`); the manager decides from it when the tier saves, asks the tiers
fastest first at restore, and knows none of them by name. A tier knows nothing of the others.

Names: a ``*Tier`` that a user writes in a config (``MemoryTier``) is a configuration; the classes that
implement :class:`CheckpointTier` are ``*Checkpointer`` (``MemoryCheckpointer``, ``DurableCheckpointer``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from goodput.checkpoint._saving import SaveResult
from goodput.checkpoint.durable.manifest import CheckpointInfo
from goodput.checkpoint.policy import SavePolicy
from goodput.errors import SaveFailed

__all__ = ["Cadence", "CheckpointTier", "Damage", "RecordTier", "Restored"]


@dataclass
class Cadence:
    """When a tier saves.

    ``policy``: its save policy (the tier tells it each save and what it cost). ``nearest``: a time-based
    policy across ranks saves at the step whose end is nearest the interval's end, not the first after it (an
    interval of a few steps). ``defers``: a time-based save due while the tier's previous save is in flight
    waits for the step after that save ends, instead of blocking training until it does.
    """

    policy: SavePolicy
    nearest: bool = False
    defers: bool = False


@dataclass(frozen=True)
class Damage:
    """What a tier's last restore found and could not load: one shape for every tier.

    ``skipped``: (step, why) of each damaged checkpoint, newest first. ``logged``: the tier named each in the
    log as it found it (else the manager does, once a step is restored). ``overwritten``: a damaged
    checkpoint's bytes were read into the live state, so a restore that loads nothing over them must stop.
    """

    skipped: list[tuple[int, str]] = field(default_factory=list)
    logged: bool = False
    overwritten: bool = False


@dataclass(frozen=True)
class Restored:
    """Which step a tier restored, and from where (``tier``: for the ledger; ``source``: this rank's own).

    The memory tier's ``tier`` is ``"peer"`` when any rank's part came from a peer node's replica, its
    ``source`` ``"peer"`` when this rank's did; the durable tier's are both ``"durable"``.
    """

    step: int
    tier: str
    source: str


class CheckpointTier(Protocol):
    """One place checkpoints live. Every rank makes the same calls in the same order.

    ``committed``: the steps this tier holds committed, newest first.
    """

    name: str
    cadence: Cadence
    committed: list[int]

    def save(self, step: int) -> object:
        """Save the training state as ``step``; returns the tier's own record of the save."""
        ...

    def charge(self, step: int, seconds: float) -> None:
        """Count ``seconds`` a faster tier blocked saving ``step`` only because this tier saves it (the faster
        tier's copy is the one this tier writes) as part of this save's cost."""
        ...

    def busy(self) -> bool:
        """Whether a save is in flight and not finished yet."""
        ...

    def wait(self) -> object:
        """Block until the save in flight, if any, is done."""
        ...

    def find(self, *, at_most: int | None = None) -> int | None:
        """List the steps this tier can restore (every rank gets the same answer) and return the newest; a
        rollback's ``at_most`` first discards every newer one (the abandoned timeline's)."""
        ...

    def restore(self, *, at_least: int | None = None) -> Restored | None:
        """Load the newest step ``find`` listed that loads, none older than ``at_least``; None when there is
        none (the next tier is asked)."""
        ...

    def damage(self) -> Damage:
        """What the last ``find`` and ``restore`` passed over."""
        ...

    def pin(self, step: int) -> None:
        """Keep the newest checkpoint at or before ``step`` until a later pin, whatever retention says."""
        ...

    def own_groups(self) -> list[Any]:
        """The process groups the tier made for itself (the manager releases them)."""
        ...

    def drop_groups(self) -> None:
        """Forget every process group (the manager releases them)."""
        ...

    def close(self, *, finished: bool) -> None:
        """Wait for the last save and release the tier's threads (``finished``: the run is over)."""
        ...


class RecordTier(CheckpointTier, Protocol):
    """The slowest tier, whose checkpoints outlive the job: ``CheckpointManager.save`` writes to it, its
    committed steps are the run's record, and its save results are the manager's."""

    results: list[SaveResult]

    @property
    def root(self) -> str:
        """Where its checkpoints live (for messages)."""
        ...

    def save(self, step: int) -> SaveResult: ...

    def wait(self) -> SaveResult | None: ...

    def settle(self) -> SaveResult | SaveFailed | None:
        """Wait for the save in flight: its result, its failure (returned, not raised) or None."""
        ...

    def to_purge(self, rows: list[CheckpointInfo]) -> list[CheckpointInfo]:
        """Which of ``rows`` retention removes."""
        ...
