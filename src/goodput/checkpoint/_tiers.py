"""The tiers a :class:`CheckpointConfig` asks for, opened for a :class:`CheckpointManager`: the memory tier when
configured (``memory/``), then the durable tier (``durable/``), each with its save policy.

Kept apart from ``manager.py`` so the manager holds a list of tiers and never names one. Every rank calls
:func:`open_tiers` at the same point of the manager's start-up (it runs collectives on the manager's groups).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from goodput.checkpoint._collectives import Collectives
from goodput.checkpoint.config import CheckpointConfig
from goodput.checkpoint.durable.checkpointer import DurableCheckpointer
from goodput.checkpoint.durable.layout import CheckpointLayout
from goodput.checkpoint.memory.setup import TierContext, open_memory_tier
from goodput.checkpoint.policy import SavePolicy, interval_events, tier_policy
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.tier import CheckpointTier, RecordTier

__all__ = ["open_tiers"]

Emit = Callable[..., None]


def _durable_policy(config: CheckpointConfig, world_size: int, emit: Emit) -> SavePolicy:
    return tier_policy(
        config,
        config.every_steps,
        config.every_seconds,
        world_size=world_size,
        on_change=interval_events(emit),
    )


def open_tiers(
    config: CheckpointConfig,
    state: TrainingState,
    coll: Collectives,
    *,
    emit: Emit,
    clock: Callable[[], float],
) -> tuple[list[CheckpointTier], RecordTier]:
    """(the faster tiers, fastest first; the durable tier, the run's record).

    Raises:
        AccessRefused: the store refuses this job's credentials (rank 0 probes a remote root).
        StorageError: the memory tier's run identity cannot be kept under the root.
    """
    layout = CheckpointLayout(config.required_root(), config.storage_options)
    policy = _durable_policy(config, coll.world_size, emit)
    token: str = coll.bcast(uuid.uuid4().hex[:12] if coll.rank == 0 else None)
    durable = DurableCheckpointer(
        config, state, layout, coll, policy=policy, token=token, emit=emit, clock=clock
    )
    if coll.rank == 0:
        durable.prepare()
    if config.memory is None:
        return [], durable
    memory = open_memory_tier(_memory_context(config, state, layout, coll, emit, clock, policy))
    durable.staged = memory  # a durable save of a step the memory tier staged writes from its copy
    return [memory], durable


def _memory_context(
    config: CheckpointConfig,
    state: TrainingState,
    layout: CheckpointLayout,
    coll: Collectives,
    emit: Emit,
    clock: Callable[[], float],
    durable_policy: SavePolicy,
) -> TierContext:
    return TierContext(
        config=config,
        state=state,
        layout=layout,
        coll=coll,
        emit=emit,
        clock=clock,
        durable_policy=durable_policy,
    )
