"""``MemoryCheckpointer``: saves to the node-local memory tier in the background and restores from it first.

A save blocks training only for the copy into a reused staging buffer. A background thread then writes this
rank's part and marker, sends the part to the buddy node (replication, see ``replica.py``), and joins one
all-gather on the tier's own gloo group, so every rank learns which steps every rank completed (the committed
steps that retention keeps). That collective runs in the background thread only: training never waits for it.

Restore: every rank lists the parts it can serve (its own parts; local rank 0 also the replicas its node holds),
one all-gather agrees on the newest step for which every rank's part exists somewhere, parts held only by a
peer are sent to their rank, each rank checks size and checksum and loads. A damaged part is skipped with a warning
and the agreement is made again without it; with no agreed step the caller falls back to the durable tier.
When another checkpoint could be loaded over it, an own part is read in one pass straight into the live tensors
and its hash checked at the end (``_memory_read``); else it is checked whole before a byte is loaded.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Any

import torch.distributed as dist

from goodput.checkpoint._contention import BackgroundCpu
from goodput.checkpoint.memory.format import CHECKSUM, Staging, decode_part, load_part, write_part
from goodput.checkpoint.memory.read import read_part_into
from goodput.checkpoint.memory.replica import ReplicaLink, Topology
from goodput.checkpoint.memory.store import MemoryStore, MemoryTier, PartIncomplete
from goodput.checkpoint.policy import SavePolicy
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.tier import Cadence, Damage, Restored
from goodput.errors import CheckpointCorrupt, StateMismatch
from goodput.faults import fault_point

__all__ = ["MemoryCheckpointer"]

log = logging.getLogger(__name__)

Emit = Callable[..., None]


class MemoryCheckpointer:
    """The memory tier of one rank (a ``CheckpointTier``).

    Args:
        tier: the configuration.
        state: the training state.
        run_id: the run's identity (the same on every rank).
        topology: every rank's node and local index.
        rank, world_size: this rank and the job's size.
        group: a gloo group of the tier's own (None: one process).
        emit: the manager's event hook.
        clock: monotonic seconds.
        policy: the tier's save policy (told what each save cost).
    """

    name = "memory"

    def __init__(
        self,
        tier: MemoryTier,
        state: TrainingState,
        *,
        run_id: str,
        topology: Topology,
        rank: int,
        world_size: int,
        group: Any,
        emit: Emit,
        clock: Callable[[], float],
        policy: SavePolicy,
    ) -> None:
        self.tier = tier
        self.state = state
        self.rank, self.world_size, self.group = rank, world_size, group
        self.topology = topology
        self.store = MemoryStore(tier, run_id, topology.nodes[rank])
        self.link = ReplicaLink(
            group,
            send_to=topology.buddy(rank, 1) if tier.replicas else None,
            receive_from=topology.buddy(rank, -1) if tier.replicas else None,
        )
        self._emit, self._clock = emit, clock
        self.cadence = Cadence(policy, nearest=True)  # its interval is a few steps: round to the nearest
        self._charged: tuple[int, float] = (-1, 0.0)  # (step, seconds) a faster tier spent for this save
        self._inventories: list[dict[str, Any]] = []  # every rank's parts, as the last ``find`` gathered them
        self._staging = Staging()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="goodput-memory")
        self._inflight: Future[None] | None = None
        self._staged_step: int | None = None  # the step whose state the staging buffer holds
        self._held: Future[Any] | None = None  # a durable save writing from the staging buffer
        self.committed: list[int] = []  # steps every rank completed, newest first
        self.overwritten = False  # a restore wrote a damaged part's bytes into the live state (see restore)
        self.failures: list[tuple[int, str]] = []  # (step, why): marked parts the last restore found damaged
        self.last_parts: dict[str, float] = {}  # the last restore's seconds: agree, load, check
        self._failing = False
        if rank == 0 and tier.replicas and topology.node_count < 2:
            log.info(
                "memory tier: one node, so there is no peer node to replicate to (replicas=1 has no effect)"
            )

    # ---- saving ---------------------------------------------------------------------------------------------
    def save(self, step: int) -> float:
        """Stage the state of ``step`` and write it in the background; returns the seconds training blocked.

        A previous save still being written is waited for first, and that wait counts as stall (the planner
        must see it: it means saves come faster than they can be written). The step just restored is not saved.
        """
        if self.committed[:1] == [step]:
            return 0.0
        self.cadence.policy.saved(step, self._clock())
        self._emit("checkpoint_stall", phase="start", step=step, tier="memory")
        start = self._clock()
        self.wait()
        if self._held is not None:  # a durable save still writing from the staging buffer (see staged_state)
            held, self._held = self._held, None
            futures_wait([held])
        self._staged_step = None
        self.state.step = step
        header = self._staging.stage(
            self.state.state_dict(), run=self.store.run_id, step=step, rank=self.rank, world=self.world_size
        )
        self._staged_step = step
        stall = self._clock() - start
        self._emit("checkpoint_stall", phase="end", step=step, seconds=stall, tier="memory")
        self._inflight = self._worker.submit(self._finish, step, header, start, stall)
        return stall

    def staged_state(self, step: int) -> dict[str, Any] | None:
        """The state this tier staged for ``step`` (tensors viewing its staging buffer), for a durable save of
        the same step to write instead of staging it again; None when ``step`` was not the last one staged or
        the state is sharded. The caller must :meth:`hold` the buffer with its write's future.
        """
        return self._staging.staged_dict() if self._staged_step == step else None

    def hold(self, future: Future[Any]) -> None:
        """Keep the staging buffer for a write that reads it: the next save waits for ``future`` before
        staging over it (a durable write takes far less than a memory-tier interval)."""
        self._held = future

    def _finish(self, step: int, header: Any, start: float, stall: float) -> None:
        cpu = BackgroundCpu()
        ok, error, digest = True, "", None
        try:
            digest = self._write_own(step, header)
        except OSError as err:
            ok, error = False, self._describe_write_error(err)
        try:
            self.link.exchange(
                step, header, self._staging.buffer, self.store, world=self.world_size, digest=digest
            )
        except (OSError, RuntimeError, CheckpointCorrupt) as err:
            log.warning("memory tier: replicating step %d failed: %s", step, err)
        everyone = self._all_gather((ok, error))
        errors = [e for good, e in everyone if not good]
        persist = self._clock() - start
        if errors:
            if not self._failing:
                log.warning(
                    "memory tier: step %d not saved (%s); the durable tier still covers it", step, errors[0]
                )
            self._failing = True
            self._emit("memory_failed", step=step, error=errors[0])
            return
        if self._failing:
            log.warning("memory tier: saving works again from step %d", step)
        self._failing = False
        self.committed = self.store.committed_after(step, self.committed)
        charged = self._charged[1] if self._charged[0] == step else 0.0
        # the write's CPU time counts where training competes for it
        self.cadence.policy.measured(stall + charged + cpu.charged(), persist)
        self.store.retain(self.committed, self.rank)
        if self.link.receive_from is not None:
            self.store.retain(self.committed, self.link.receive_from, replica=True)
        self._emit(
            "memory_saved", step=step, stall_seconds=stall, persist_seconds=persist, bytes=header.data_bytes
        )

    def _write_own(self, step: int, header: Any) -> str:
        """Write and mark this rank's part of ``step``; returns its checksum."""
        folder = self.store.begin(step)
        marker = os.path.join(folder, f"rank-{self.rank}.json")
        if os.path.exists(marker):
            os.remove(marker)  # an earlier attempt's part of this step: never let its marker vouch for ours
        path = self.store.part_path(step, self.rank)
        if not os.path.exists(path):
            self.store.recycle(self.rank, path)
        try:
            size, digest = write_part(path, header, self._staging.buffer)
        except OSError:
            _remove(path)  # free the space a partial part holds
            raise
        fault_point("memory_write", step)  # written, not marked
        self.store.mark(step, self.rank, self.world_size, size, digest)
        return digest

    def _describe_write_error(self, err: OSError) -> str:
        if err.errno == errno.ENOSPC:
            return (
                f"the memory-tier folder {self.tier.folder} is full (No space left on device); make the tmpfs"
                " larger, lower keep, or set memory=None"
            )
        return f"{type(err).__name__}: {err}"

    def charge(self, step: int, seconds: float) -> None:
        """Count ``seconds`` of a faster tier's stall as part of saving ``step`` (the policy's cost of a save)."""
        self._charged = (step, seconds)

    def busy(self) -> bool:
        """Whether a save is in flight and not finished yet."""
        return self._inflight is not None and not self._inflight.done()

    def wait(self) -> None:
        """Block until the save in flight (if any) is written, replicated and agreed."""
        if self._inflight is not None:
            future, self._inflight = self._inflight, None
            try:
                future.result()
            except Exception:
                log.exception("memory tier: a background save failed")

    # ---- restoring -----------------------------------------------------------------------------------------
    def inventory(self) -> dict[str, Any]:
        """The parts this rank can serve: its own steps, and (local rank 0) its node's replicas by rank."""
        own = [
            s  # a step folder without this rank's part holds other ranks' parts only (or is being dropped)
            for s in self.store.steps()
            if self.rank in self.store.ranks_in(s) and self._plausible(s, self.rank, replica=False)
        ]
        replicas: dict[int, list[int]] = {}
        if self.topology.local[self.rank] == 0:
            for s in self.store.steps(replica=True):
                for r in self.store.ranks_in(s, replica=True):
                    if r != self.rank and self._plausible(s, r, replica=True):
                        replicas.setdefault(r, []).append(s)
        return {"own": own, "replicas": replicas}

    def _plausible(self, step: int, rank: int, *, replica: bool) -> bool:
        """Marker present, of this run, and the part's size matches (the checksum is checked when loading)."""
        try:
            marker = self.store.marker(step, rank, self.world_size, replica=replica)
            size = os.path.getsize(self.store.part_path(step, rank, replica=replica))
        except (CheckpointCorrupt, OSError) as err:
            # A save a kill interrupted is what a restart expects to find: no warning for it (damage gets one).
            level = logging.INFO if isinstance(err, PartIncomplete) else logging.WARNING
            log.log(level, "memory tier: skipping rank %d's part of step %d%s: %s",
                    rank, step, " (replica)" if replica else "", err)  # fmt: skip
            return False
        if size != marker["bytes"]:
            log.warning("memory tier: skipping rank %d's part of step %d%s: %d bytes, its marker says %d"
                        " (truncated?)", rank, step, " (replica)" if replica else "", size, marker["bytes"])  # fmt: skip
            return False
        return True

    def find(self, *, at_most: int | None = None) -> int | None:
        """Agree with every rank on the parts each can serve; returns the newest step every rank's part exists
        for somewhere (None: none). Parts without a marker (never completed) or of another world size are no
        checkpoints of this run and are not listed.

        ``at_most``: a rollback's ceiling: parts of newer steps that this rank holds (its own, and the replicas
        its node holds) are discarded first, as the abandoned timeline's.
        """
        self.wait()
        begin = self._clock()
        if at_most is not None:
            self._discard_newer(at_most)
        self._inventories = self._all_gather(self.inventory())
        self.overwritten = False
        self.failures = []
        self.last_parts = {"agree": self._clock() - begin, "load": 0.0, "check": 0.0}
        choice = _agree(self._inventories, self.world_size, set(), -1)
        return choice[0] if choice is not None else None

    def restore(self, *, at_least: int | None = None) -> Restored | None:
        """Load the newest step ``find`` agreed on (not older than ``at_least``) that every rank loads.

        Returns None when there is none (the next tier is asked); ``failures`` then lists the marked parts found
        damaged while loading (the same on every rank).

        Raises:
            StateMismatch: the newest agreed step does not fit this run's model or optimizer.
        """
        inventories = self._inventories
        bad: set[tuple[int, int, int]] = set()  # (rank, step, holder) found damaged
        floor = -1 if at_least is None else at_least
        while (choice := _agree(inventories, self.world_size, bad, floor)) is not None:
            step, holders = choice
            # One pass (read into the live tensors, check the hash at the end) when another checkpoint can be
            # loaded over a part found damaged; else check first and copy after (nothing to fall back to).
            tried = bad | {(r, step, h) for r, h in enumerate(holders)}
            in_place = at_least is not None or _agree(inventories, self.world_size, tried, floor) is not None
            loading = self._clock()
            outcome = self._load_step(step, holders, in_place=in_place)
            loaded = self._clock()
            outcomes = self._all_gather(outcome)
            self.last_parts["load"] += loaded - loading
            self.last_parts["check"] += self._clock() - loaded
            mismatches = [d for status, d in outcomes if status == "mismatch"]
            if mismatches:
                raise StateMismatch(f"memory-tier step {step}: {mismatches[0]}")
            damaged = [(r, d) for r, (status, d) in enumerate(outcomes) if status != "ok"]
            if not damaged:
                fault_point("memory_restore", step)  # loaded, not yet in use
                tier = "peer" if any(h != r for r, h in enumerate(holders)) else "memory"
                source = "peer" if holders[self.rank] != self.rank else "memory"
                self.committed = [step]
                return Restored(step, tier, source)
            self.overwritten = self.overwritten or in_place  # some rank's live state may hold its bytes
            for r, detail in damaged:
                log.warning("memory tier: skipping rank %d's part of step %d: %s", r, step, detail)
                self.failures.append((step, f"rank {r}'s part: {detail}"))
                bad.add((r, step, holders[r]))
        return None

    def _discard_newer(self, ceiling: int) -> None:
        """Remove this rank's parts, and the replicas its node holds, newer than ``ceiling`` (markers first, so
        they never count; the parts too, so the inventory does not take them for saves that never completed)."""
        for replica in (False, True):
            if replica and self.topology.local[self.rank] != 0:
                continue
            for step in self.store.steps(replica=replica):
                ranks = self.store.ranks_in(step, replica=replica) if replica else [self.rank]
                for rank in ranks if step > ceiling else []:
                    self.store.drop(step, rank, replica=replica)
        self.committed = [s for s in self.committed if s <= ceiling]

    def _load_step(self, step: int, holders: list[int], *, in_place: bool) -> tuple[str, str]:
        blob: bytearray | memoryview | None = None
        marker: dict[str, Any] = {}
        try:
            for r, holder in enumerate(holders):
                if holder == r:
                    continue
                if holder == self.rank:
                    self.link.send_part(self.store, step, r, world=self.world_size, dst=r)
                elif r == self.rank:
                    marker, blob = self.link.receive_part(src=holder)
            if blob is None and in_place:
                marker = self.store.marker(step, self.rank, self.world_size)
                path = self.store.part_path(step, self.rank)
                try:
                    loaded = read_part_into(
                        path,
                        size=int(marker["bytes"]),
                        digest=str(marker[CHECKSUM]),
                        current=self.state.state_dict(),
                        expect=(self.store.run_id, step, self.rank),
                    )
                except CheckpointCorrupt:
                    _remove(path[: -len(".part")] + ".json")  # damaged: never tried (or read in place) again
                    raise
                self.state.load_state_dict(loaded)
                return ("ok", "")
            if blob is None:
                marker = self.store.marker(step, self.rank, self.world_size)
                blob = self.store.read(step, self.rank)
            header, data = decode_part(
                memoryview(blob), size=int(marker["bytes"]), digest=str(marker[CHECKSUM])
            )
            blob = None  # the mapping lives as long as ``data`` does
            if header.run != self.store.run_id or header.rank != self.rank or header.step != step:
                raise CheckpointCorrupt(f"holds step {header.step} of rank {header.rank} of run {header.run}")
            self.state.load_state_dict(load_part(header, data, self.state.state_dict()))
        except StateMismatch as err:
            return ("mismatch", str(err))
        except (
            CheckpointCorrupt,
            OSError,
            ValueError,
            KeyError,
            TypeError,
        ) as err:  # TypeError: a bad marker
            return ("damaged", f"{type(err).__name__}: {err}")
        return ("ok", "")

    def damage(self) -> Damage:
        """The parts the last restore found damaged (each named in the log as found)."""
        return Damage(sorted(self.failures, reverse=True), logged=True, overwritten=self.overwritten)

    def pin(self, step: int) -> None:
        """Keep the newest committed step at or before ``step`` (see ``MemoryStore.pin``)."""
        self.store.pin(step)

    # ---- lifetime -------------------------------------------------------------------------------------------
    def _all_gather(self, mine: Any) -> list[Any]:
        if self.group is None:
            return [mine]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, mine, group=self.group)
        return out

    def close(self, *, finished: bool) -> None:
        """Wait for the last save; when the run ``finished``, remove its memory folder on this node."""
        self.wait()
        self._worker.shutdown(wait=True)
        if finished and self.topology.local[self.rank] == 0:
            self.store.remove_run()

    def own_groups(self) -> list[Any]:
        """The tier's own gloo group (the manager releases it)."""
        return [self.group] if self.group is not None else []

    def drop_groups(self) -> None:
        """Forget the tier's group (the manager releases it)."""
        self.group = self.link.group = None


def _agree(
    inventories: list[dict[str, Any]], world: int, bad: set[tuple[int, int, int]], floor: int
) -> tuple[int, list[int]] | None:
    """The newest step whose every rank's part some rank can serve, and who serves each (own first)."""
    servers: dict[tuple[int, int], list[int]] = {}
    for holder, inv in enumerate(inventories):
        for step in inv["own"]:
            servers.setdefault((holder, step), []).insert(0, holder)
        for rank, steps in inv["replicas"].items():
            for step in steps:
                servers.setdefault((int(rank), step), []).append(holder)
    steps = sorted({step for _, step in servers if step >= floor}, reverse=True)
    for step in steps:
        holders = []
        for r in range(world):
            usable = [h for h in servers.get((r, step), []) if (r, step, h) not in bad]
            if not usable:
                break
            holders.append(usable[0])
        else:
            return step, holders
    return None


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
