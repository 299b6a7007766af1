"""Opening the memory tier for a :class:`CheckpointManager`: its group, run identity, topology and policy.

Kept apart from the manager so it only gets a ready tier (``_tiers.py`` passes what the tier needs in a
:class:`TierContext`). Every rank calls :func:`open_memory_tier` at the same point of the manager's start-up
(it runs collectives on the manager's control group).
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from goodput.checkpoint._collectives import Collectives
from goodput.checkpoint.config import CheckpointConfig
from goodput.checkpoint.durable.layout import CheckpointLayout
from goodput.checkpoint.memory.checkpointer import MemoryCheckpointer
from goodput.checkpoint.memory.listing import run_identity
from goodput.checkpoint.memory.replica import Topology
from goodput.checkpoint.policy import AutoInterval, SavePolicy, interval_events, tier_policy
from goodput.checkpoint.state import TrainingState
from goodput.errors import StorageError
from goodput.planning.twolevel import durable_share

__all__ = ["RUN_ID_FILE", "TierContext", "open_memory_tier"]

RUN_ID_FILE = "memory-tier-id"


@dataclasses.dataclass
class TierContext:
    """What the memory tier needs from its manager, passed explicitly (the manager's own members stay its own).

    ``coll`` holds the manager's groups and the collectives the tier runs on them; ``emit(name, **fields)``
    reports a checkpoint event; ``durable_policy`` is the durable tier's save policy, whose planned failure
    share the memory tier narrows.
    """

    config: CheckpointConfig
    state: TrainingState
    layout: CheckpointLayout
    coll: Collectives
    emit: Callable[..., None]
    clock: Callable[[], float]
    durable_policy: SavePolicy


def node_of_this_process() -> tuple[int, int]:
    """(node number, local index) from torchrun's environment (GROUP_RANK, LOCAL_RANK); (0, 0) alone."""
    return int(os.environ.get("GROUP_RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))


def _run_token(layout: CheckpointLayout) -> tuple[str, str]:
    """This run's token, kept in the durable root (created by the first attempt), and no error."""
    path = layout.join(RUN_ID_FILE)
    try:
        return layout.read_text(path).strip(), ""
    except FileNotFoundError:
        pass
    if layout.local:
        os.makedirs(layout.root, exist_ok=True)
    token = uuid.uuid4().hex[:12]
    layout.write_text(path, token)
    return token, ""


def _policy(ctx: TierContext) -> SavePolicy:
    tier = ctx.config.memory
    assert tier is not None
    return tier_policy(
        ctx.config,
        tier.every_steps,
        tier.every_seconds,
        world_size=ctx.coll.world_size,
        on_change=interval_events(ctx.emit, tier="memory"),
    )


def open_memory_tier(ctx: TierContext) -> MemoryCheckpointer:
    """The memory tier, with its save policy, its own gloo group and this node's folder ready.

    Raises:
        StorageError: the run's identity cannot be read or written under the durable root.
    """
    tier = ctx.config.memory
    assert tier is not None
    coll = ctx.coll
    group: Any = dist.new_group(ranks=coll.ranks, backend="gloo") if coll.distributed else None
    token, error = coll.rank0_decides(
        lambda: _run_token(ctx.layout), lambda err: ("", f"{type(err).__name__}: {err}")
    )
    if error:
        raise StorageError(f"cannot keep the run identity {ctx.layout.join(RUN_ID_FILE)}: {error}")
    places = coll.all_gather(node_of_this_process())
    topology = Topology([int(p[0]) for p in places], [int(p[1]) for p in places])
    policy = _policy(ctx)
    share = durable_share(tier.node_loss_share, replicated=bool(tier.replicas) and topology.node_count > 1)
    if isinstance(policy, AutoInterval):
        policy.failure_share = 1.0 - share
    if isinstance(
        ctx.durable_policy, AutoInterval
    ):  # two levels: durable saves plan only for what memory misses
        ctx.durable_policy.failure_share = share
    memory = MemoryCheckpointer(
        tier,
        ctx.state,
        run_id=run_identity(ctx.layout.root, token),
        topology=topology,
        rank=coll.rank,
        world_size=coll.world_size,
        group=group,
        emit=ctx.emit,
        clock=ctx.clock,
        policy=policy,
    )
    if topology.local[coll.rank] == 0:
        memory.store.prepare()
    return memory
