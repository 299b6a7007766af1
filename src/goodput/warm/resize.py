"""Shrinking and growing a warm job in place (``goodput launch --restart warm --shrink-after S``): the agent's side.

When a rank fails and no spare is ready to take it within ``shrink_after`` seconds (``--spares 0``, or the
spares used up or still importing), the agent publishes a generation of kind ``shrink``: the survivors,
renumbered ``0..W'-1`` in their old order, form a smaller group and recover live from the replicas they hold
(no process restart, no checkpoint read). Replacement processes are started meanwhile as spares, up to the
job's reserved ranks; once one has finished its imports (its ``spare/<k>/ready`` key), the agent publishes a
generation of kind ``grow`` that appends it as the highest rank. The survivors leave their generation at their
next step boundary (the end watch, ``goodput.warm.watch``), form the larger group, and the newcomer receives
the state from a replica. The data position is a global sample count that the loader re-splits over the new
world (``goodput.data.order``), so nothing repeats and nothing is skipped.

Both are warm generations: the worker side is the warm path (``goodput.warm.worker``) with a renumbering, and a
failure while one is pending shrinks again instead of restarting cold (the survivors keep the state they held
before it). Only one node: several nodes are refused by ``check_warm``. A model-sharded job (FSDP2 without
replicas: a rank says so under ``job/sharded``) never shrinks: a failure takes the spare-or-fresh-process
path, and the state comes from the newest checkpoint, resharded on restore.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from goodput.warm import protocol

if TYPE_CHECKING:
    from goodput.warm.agent import WarmAgent, _Slot

__all__ = ["Resizer"]


class Resizer:
    """The agent's shrink and grow decisions (inert when ``WarmConfig.shrink_after`` is None)."""

    def __init__(self, agent: WarmAgent) -> None:
        self.agent = agent
        self.after = agent.warm.shrink_after
        self.newcomers: set[int] = set()  # ranks of a pending grow that hold no state yet

    @property
    def on(self) -> bool:
        """Whether the job may shrink."""
        return self.after is not None

    def wanted_spares(self) -> int:
        """Spares to keep: the configured ones, plus one per reserved rank the group lacks (its way back)."""
        agent = self.agent
        return agent.warm.spares + (agent.reserved - agent.world_size if self.on else 0)

    # ---- a failure -------------------------------------------------------------------------------------------
    def answer(self, failed: set[int], detected: float, *, during: bool) -> bool:
        """Shrink instead of a hand-over (no spare ready in time) or of a cold restart (``during``: a failure
        while a shrink or grow was pending; the survivors still hold their state); whether it did."""
        if not self.on:
            return False
        if not during:
            failed = self.wait_for_spares(failed)
        if not (self.can_shrink(failed) if during else self.should_shrink(failed)):
            return False
        self.agent.pending = None
        self.shrink(sorted(failed), detected)
        return True

    def wait_for_spares(self, failed: set[int]) -> set[int]:
        """Wait up to ``shrink_after`` seconds for as many ready spares as failed ranks; start the missing
        spares now. Returns the failed ranks, with any further failure seen meanwhile."""
        agent = self.agent
        assert self.after is not None
        deadline = time.monotonic() + self.after
        while True:
            alive = [slot for slot in agent.spares if slot.ctx.wait(0) is None]
            for _ in range(len(failed) - len(alive)):
                agent.start_spare()
            if self._ready_count() >= len(failed) or time.monotonic() >= deadline:
                return failed
            time.sleep(agent.launch.monitor_interval)
            failed |= set(agent.poll_workers())

    def should_shrink(self, failed: set[int]) -> bool:
        """Whether to go on without ``failed``: too few spares ready, and enough survivors left."""
        return self._ready_count() < len(failed) and self.can_shrink(failed)

    def can_shrink(self, failed: set[int]) -> bool:
        """Whether enough ranks survive ``failed`` to train on (``--min-world``)."""
        agent = self.agent
        if not self.on or agent.store.check([protocol.SHARDED_KEY]):  # no replica to go on with (FSDP)
            return False
        return len([r for r in agent.workers if r not in failed]) >= agent.warm.min_world

    def _ready(self) -> list[_Slot]:
        agent = self.agent
        return [
            slot
            for slot in agent.spares
            if slot.ctx.wait(0) is None
            and agent.store.check([protocol.spare_ready_key(_spare_id(agent, slot))])
        ]

    def _ready_count(self) -> int:
        ready = self._ready()
        self.agent.spares.sort(key=lambda slot: slot not in ready)  # hand over ready spares first
        return len(ready)

    def shrink(self, failed: list[int], detected: float) -> None:
        """Publish a smaller generation of the survivors, renumbered in their old order."""
        agent = self.agent
        survivors = sorted(rank for rank in agent.workers if rank not in failed)
        ranks = {old: new for new, old in enumerate(survivors)}
        old_gen, before = agent.gen, agent.world_size
        if not agent.claim_next():
            return
        agent.workers = {ranks[rank]: slot for rank, slot in agent.workers.items() if rank in ranks}
        self._resized(len(survivors))
        handover = time.time()
        agent.publish(
            "shrink",
            failed=failed,
            from_gen=old_gen,
            ranks={str(old): new for old, new in ranks.items()},
            world_size=agent.world_size,
            world_before=before,
            detected_wall=detected,
            handover_wall=handover,
        )
        agent.store.set(protocol.CURRENT_KEY, str(agent.gen))
        agent.record(
            "shrink",
            gen=agent.gen,
            failed=failed,
            world_before=before,
            world_after=agent.world_size,
            detected_wall=detected,
            handover_seconds=round(handover - detected, 6),
        )
        agent.notice(
            failed,
            f"no spare ready within {self.after:g}s: {agent.world_size} of {agent.reserved} ranks train on "
            f"(generation {agent.gen})",
        )
        agent.fill_spares()

    # ---- capacity back ---------------------------------------------------------------------------------------
    def maybe_grow(self) -> None:
        """Take ready spares back into a shrunk group (at the survivors' next step boundary)."""
        agent = self.agent
        if not self.on or agent.pending is not None or agent.finished or agent.world_size >= agent.reserved:
            return
        ready = self._ready()[: agent.reserved - agent.world_size]
        if not ready:
            return
        seen = time.time()
        old_gen, before = agent.gen, agent.world_size
        if not agent.claim_next():
            return
        agent.spares.sort(key=lambda slot: slot not in ready)
        self._resized(before + len(ready))
        handed = [agent.hand_over(rank) for rank in range(before, agent.world_size)]
        self.newcomers = set(range(before, agent.world_size))
        agent.publish(
            "grow",
            failed=[],
            from_gen=old_gen,
            ranks={str(rank): rank for rank in range(before)},
            world_size=agent.world_size,
            world_before=before,
            joined=len(ready),
            ready_wall=seen,
            detected_wall=seen,
            handover_wall=time.time(),
        )
        agent.store.set(protocol.CURRENT_KEY, str(agent.gen))
        agent.record("grow", gen=agent.gen, world_before=before, world_after=agent.world_size, handed=handed)
        grown = f"{agent.world_size} of {agent.reserved} ranks train on (generation {agent.gen})"
        agent.notice([], f"{len(ready)} spare(s) ready: {grown}")
        agent.fill_spares()

    def finished_before_grow(self) -> bool:
        """Whether every rank but a pending grow's newcomers has finished (the job ended as it grew)."""
        agent = self.agent
        return bool(self.newcomers) and agent.finished >= set(agent.ranks) - self.newcomers

    # ---- shared ----------------------------------------------------------------------------------------------
    def _resized(self, world: int) -> None:
        agent = self.agent
        agent.world_size = world
        agent.ranks = list(range(world))
        agent.pending = (agent.gen, time.monotonic() + agent.warm.reform_timeout)
        self.newcomers = set()


def _spare_id(agent: WarmAgent, slot: _Slot) -> str:
    return f"{agent.node_rank}-{slot.spare}"
