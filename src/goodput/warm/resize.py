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
before it). A model-sharded job (FSDP2 without replicas: a rank says so under ``job/sharded``) never shrinks: a
failure takes the spare-or-fresh-process path, and the state comes from the newest checkpoint, resharded on
restore.

Several nodes (``--nnodes N``): the ranks are renumbered across every node (``goodput.warm.nodes.Layout``, in the
generation's info); the agent that decides publishes the generation and the others follow it (``follow``). A
node lost whole is found by its silent heartbeat (``goodput.warm.nodes``): its ranks are dropped at once (no
spare of another node takes them: each node keeps at most ``--nproc`` ranks). A node grows back only to its own
``--nproc``, with its own spares.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from goodput.warm.nodes import Layout, first_layout, renumbered
from goodput.warm.protocol import Generation
from goodput.warm.rounds import next_round, to_join
from goodput.warm.store import operations

if TYPE_CHECKING:
    from goodput.warm.agent import WarmAgent, _Slot

__all__ = ["Resizer"]


class Resizer:
    """The agent's shrink and grow decisions (inert when ``WarmConfig.shrink_after`` is None)."""

    def __init__(self, agent: WarmAgent) -> None:
        self.agent = agent
        self.after = agent.warm.shrink_after
        self.newcomers: set[int] = set()  # ranks of a pending grow that hold no state yet (until it recovers)
        self._lost_told: set[int] = set()  # lost nodes already reported and not shrunk away
        self._next_poll = 0.0  # when to look for nodes waiting in the rendezvous next
        self._round_nodes = 0  # the nodes of the newest rendezvous round, until a node leaves the layout

    @property
    def on(self) -> bool:
        """Whether the job may shrink."""
        return self.after is not None

    def wanted_spares(self) -> int:
        """Spares to keep: the configured ones, plus one per reserved rank the group lacks (its way back)."""
        agent = self.agent
        return agent.warm.spares + (agent.nproc - len(agent.ranks) if self.on else 0)

    def lost_ranks(self) -> list[int]:
        """The ranks of the nodes of the current layout whose heartbeat stopped (``goodput.warm.nodes``)."""
        agent = self.agent
        if agent.beats is None or not self.on:
            return []
        silent = agent.beats.silent(agent.store, sorted(agent.layout), agent.warm.pg_timeout)
        return sorted(r for node in silent if node not in self._lost_told for r in agent.layout[node])

    def told(self, lost: list[int]) -> None:
        """The nodes of the ``lost`` ranks are reported lost without a shrink: not again."""
        self._lost_told |= {n for n, ranks in self.agent.layout.items() if ranks and set(ranks) <= set(lost)}

    # ---- a failure -------------------------------------------------------------------------------------------
    def answer(self, failed: set[int], detected: float, *, during: bool, node_lost: bool = False) -> bool:
        """Shrink instead of a hand-over (no spare ready in time) or of a cold restart (``during``: a failure
        while a shrink or grow was pending; the survivors still hold their state); whether it did. A lost
        node's ranks (``node_lost``) shrink away at once: this node's spares are for its own ranks."""
        if not self.on:
            return False
        if node_lost:
            self._lost_told |= {n for n, ranks in self.agent.layout.items() if set(ranks) <= failed}
        elif not during:
            failed = self.wait_for_spares(failed)
        if not (self.can_shrink(failed) if during or node_lost else self.should_shrink(failed)):
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
        if not self.on or agent.store.sharded():  # no replica to go on with (FSDP)
            return False
        return agent.world_size - len(failed) >= agent.warm.min_world

    def _ready(self) -> list[_Slot]:
        agent = self.agent
        return [
            slot
            for slot in agent.spares
            if slot.ctx.wait(0) is None
            and slot.spare is not None
            and agent.store.spare_ready(agent.spare_id(slot.spare))
        ]

    def _ready_count(self) -> int:
        ready = self._ready()
        self.agent.spares.sort(key=lambda slot: slot not in ready)  # hand over ready spares first
        return len(ready)

    def shrink(self, failed: list[int], detected: float) -> None:
        """Publish a smaller generation of the survivors, renumbered in their old order."""
        agent = self.agent
        survivors = sorted(rank for held in agent.layout.values() for rank in held if rank not in failed)
        ranks = {old: new for new, old in enumerate(survivors)}
        old_gen, before = agent.gen, agent.world_size
        if not agent.claim_next():
            return
        self._renumber(ranks)
        self._resized(renumbered(agent.layout, ranks))
        handover = time.time()
        agent.publish(
            "shrink",
            failed=failed,
            from_gen=old_gen,
            ranks=ranks,
            nodes=agent.layout,
            world_size=agent.world_size,
            world_before=before,
            detected_wall=detected,
            handover_wall=handover,
        )
        agent.record(
            "shrink",
            gen=agent.gen,
            failed=failed,
            world_before=before,
            world_after=agent.world_size,
            detected_wall=detected,
            handover_seconds=round(handover - detected, 6),
            store_ops=operations(),
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
        self.admit_waiting()
        if not self.on or agent.pending is not None or agent.finished or len(agent.ranks) >= agent.nproc:
            return
        ready = self._ready()[: agent.nproc - len(agent.ranks)]
        if not ready:
            return
        seen = time.time()
        old_gen, before = agent.gen, agent.world_size
        if not agent.claim_next():
            return
        agent.spares.sort(key=lambda slot: slot not in ready)
        joined = list(range(before, before + len(ready)))
        self._resized(renumbered(agent.layout, {r: r for r in range(before)}, {agent.node_rank: joined}))
        handed = [agent.hand_over(rank) for rank in joined]
        self.newcomers = set(range(before, agent.world_size))
        agent.publish(
            "grow",
            failed=[],
            from_gen=old_gen,
            ranks={rank: rank for rank in range(before)},
            nodes=agent.layout,
            world_size=agent.world_size,
            world_before=before,
            joined=len(ready),
            ready_wall=seen,
            detected_wall=seen,
            handover_wall=time.time(),
        )
        agent.record(
            "grow",
            gen=agent.gen,
            world_before=before,
            world_after=agent.world_size,
            handed=handed,
            store_ops=operations(),
        )
        grown = f"{agent.world_size} of {agent.reserved} ranks train on (generation {agent.gen})"
        agent.notice([], f"{len(ready)} spare(s) ready: {grown}")
        agent.fill_spares()

    def admit_waiting(self, now: bool = False) -> None:
        """Join the rendezvous's next round when a node waits in it, as torchrun's agent does: the round admits
        the node (its agent then grows the job with its own spares); the workers train on meanwhile. Also when
        the rendezvous dropped this node (:func:`goodput.warm.rounds.to_join`). A look at most once a second,
        unless ``now`` (the job's end, when the agent would otherwise leave before it)."""
        agent = self.agent
        if agent.rdzv is None or not self.on or (time.monotonic() < self._next_poll and not now):
            return
        self._next_poll = time.monotonic() + 1.0  # each look reads the rendezvous state from the store
        waiting, dropped = to_join(agent.rdzv)
        if waiting or dropped:
            agent.record("rendezvous_round", waiting=waiting, dropped=dropped)
            joined = next_round(agent.rdzv, agent.store)
            self._round_nodes = joined.nodes
            agent.record("rendezvous_round_done", nodes=joined.nodes)

    def nodes_in_job(self) -> int:
        """The nodes whose agents count themselves done at the job's end (``nodes_done``): the layout's, or those
        of the newest rendezvous round when it admitted a node the layout does not hold yet (the job ended
        before or as that node grew it); the agent hosting the store must not close it before they are done."""
        return max(len(self.agent.layout), self._round_nodes)

    def finished_before_grow(self) -> bool:
        """Whether the job ended as it grew: every rank but a pending grow's newcomers has finished. A node that
        joined holds only newcomers, which no rank of its own can end: its part is over when another node's
        agent has counted its ranks done (``nodes_done``) while the grow is still pending."""
        agent = self.agent
        if not self.newcomers:
            return False
        held = set(agent.ranks) - self.newcomers
        if held:
            return agent.finished >= held
        return agent.pending is not None and agent.store.any_node_done()

    # ---- shared ----------------------------------------------------------------------------------------------
    def follow_current(self) -> None:
        """Join a generation another node's agent made: a shrink or grow renumbers this node's ranks too, a cold
        one restarts this node's workers."""
        agent = self.agent
        if not agent.prefix:
            return
        current = agent.store.current()
        if current <= agent.gen:
            return
        info = agent.store.generation(current)
        agent.gen = current
        if info.kind != "cold":
            self._follow_resize(info)
            return
        agent.stop(list(agent.workers.values()))
        agent.workers.clear()
        agent.finished.clear()
        agent.pending = None
        agent.cold_restarts += 1
        agent.set_layout(info.nodes or first_layout(agent.nnodes, agent.nproc))
        agent.record("cold_restart_followed", gen=current, reason=info.reason)
        agent.notice([], f"cold restart of every rank, as another node's agent decided ({info.reason})")
        for rank in agent.ranks:
            agent.start_worker(rank)

    def _follow_resize(self, info: Generation) -> None:
        if info.kind not in ("shrink", "grow"):
            return  # a hand-over to a spare of another node: nothing changes here
        assert info.ranks is not None and info.nodes is not None  # every shrink and grow carries both
        agent = self.agent
        self._renumber(info.ranks)
        self._set_layout(info.nodes)
        self.newcomers = set()
        agent.record(f"{info.kind}_followed", gen=agent.gen, world_after=agent.world_size)

    def cold_layout(self) -> Layout:
        """The layout of a cold restart: every node still in the job with ``--nproc`` ranks, numbered anew."""
        agent = self.agent
        nodes = sorted(set(agent.layout) | {agent.node_rank})
        full = first_layout(len(nodes), agent.nproc)
        return {node: full[i] for i, node in enumerate(nodes)}

    def _renumber(self, ranks: dict[int, int]) -> None:
        """Re-key this node's workers by ``ranks`` (old -> new); a worker not in it is gone."""
        agent = self.agent
        agent.workers = {ranks[rank]: slot for rank, slot in agent.workers.items() if rank in ranks}
        agent.finished = {ranks[rank] for rank in agent.finished if rank in ranks}

    def _resized(self, layout: Layout) -> None:
        agent = self.agent
        self._set_layout(layout)
        agent.pending = (agent.gen, time.monotonic() + agent.warm.reform_timeout)
        self.newcomers = set()

    def _set_layout(self, layout: Layout) -> None:
        """Take a shrunk or grown layout; a node that left it also left the newest round's count."""
        if len(layout) < len(self.agent.layout):
            self._round_nodes = 0
        self.agent.set_layout(layout)
