"""Opening the memory tier for a :class:`CheckpointManager`: its group, run identity, topology and policy.

Kept apart from ``manager.py`` so the manager only asks for a ready tier. Every rank calls
:func:`open_memory_tier` at the same point of the manager's start-up (it runs collectives on the manager's
control group).
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from goodput.checkpoint.memory.checkpointer import (
    MemoryCheckpointer,
    Topology,
    node_of_this_process,
    run_identity,
)
from goodput.checkpoint.policy import AutoInterval, EveryInterval, EverySteps, SavePolicy
from goodput.errors import StorageError
from goodput.planning.twolevel import durable_share

if TYPE_CHECKING:
    from goodput.checkpoint.manager import CheckpointManager

__all__ = ["RUN_ID_FILE", "open_memory_tier"]

RUN_ID_FILE = "memory-tier-id"


def _run_token(manager: CheckpointManager) -> tuple[str, str]:
    """This run's token, kept in the durable root (created by the first attempt): (token, error)."""
    layout = manager._layout
    path = layout.join(RUN_ID_FILE)
    try:
        try:
            return layout._read_text(path).strip(), ""
        except FileNotFoundError:
            pass
        if layout.local:
            os.makedirs(layout.root, exist_ok=True)
        token = uuid.uuid4().hex[:12]
        layout._write_text(path, token)
        return token, ""
    except Exception as err:  # every rank waits for rank 0's word: always send one
        return "", f"{type(err).__name__}: {err}"


def _policy(manager: CheckpointManager) -> SavePolicy:
    tier = manager.config.memory
    assert tier is not None
    if tier.every_steps is not None:
        return EverySteps(tier.every_steps)
    if tier.every_seconds is not None:
        return EveryInterval(tier.every_seconds)
    cfg = manager.config
    return AutoInterval(
        mtbf=cfg.prior_mtbf(manager.world_size),
        max_interval=cfg.seconds("max_interval"),
        restart=cfg.seconds("restart"),
        detect=cfg.seconds("detect"),
        on_change=lambda interval, why: manager._emit(
            "checkpoint_interval", interval_seconds=interval, reason=why, tier="memory"
        ),
    )


def open_memory_tier(
    manager: CheckpointManager, ranks: list[int] | None
) -> tuple[MemoryCheckpointer, SavePolicy]:
    """The manager's memory tier and its save policy, with this node's folder ready.

    Raises:
        StorageError: the run's identity cannot be read or written under the durable root.
    """
    tier = manager.config.memory
    assert tier is not None
    group: Any = dist.new_group(ranks=ranks, backend="gloo") if manager._dist else None
    manager._memory_group = group
    token, error = manager._bcast(_run_token(manager) if manager.rank == 0 else None)
    if error:
        raise StorageError(f"cannot keep the run identity {manager._layout.join(RUN_ID_FILE)}: {error}")
    places = manager._all_gather(node_of_this_process())
    topology = Topology([int(p[0]) for p in places], [int(p[1]) for p in places])
    policy = _policy(manager)
    share = durable_share(tier.node_loss_share, replicated=bool(tier.replicas) and topology.node_count > 1)
    if isinstance(policy, AutoInterval):
        policy.failure_share = 1.0 - share
    if isinstance(
        manager._policy, AutoInterval
    ):  # two levels: durable saves plan only for what memory misses
        manager._policy.failure_share = share
    memory = MemoryCheckpointer(
        tier,
        manager.state,
        run_id=run_identity(manager._layout.root, token),
        topology=topology,
        rank=manager.rank,
        world_size=manager.world_size,
        group=group,
        emit=manager._emit,
        clock=manager._clock,
        on_measured=policy.measured,
    )
    if topology.local[manager.rank] == 0:
        memory.store.prepare()
    return memory, policy
