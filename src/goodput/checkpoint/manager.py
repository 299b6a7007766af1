"""``CheckpointManager``: when each tier saves, one save in flight, and restore of the newest valid step.

Every rank makes the same calls in the same order (``should_save``, ``save``, ``restore_latest``, ``close``).
The manager holds a list of tiers behind one protocol (``tier.py``): the memory tier when configured
(``memory/``), then the durable tier (``durable.py``: strategy, layout, retention). It decides when each saves
and asks the fastest first at restore; the tiers run their collectives on two gloo groups of the manager's own
(``_collectives.py``), made from the training group's ranks.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from goodput._storage_errors import refusals_named
from goodput.checkpoint._collectives import Collectives
from goodput.checkpoint._groups import release_groups
from goodput.checkpoint._restoring import none_loaded
from goodput.checkpoint._retention import to_purge
from goodput.checkpoint._saving import SaveResult, quiet_single_process
from goodput.checkpoint.config import CheckpointConfig
from goodput.checkpoint.durable import DurableTier
from goodput.checkpoint.layout import CheckpointLayout
from goodput.checkpoint.manifest import CheckpointInfo
from goodput.checkpoint.memory.checkpointer import MemoryCheckpointer
from goodput.checkpoint.memory.setup import TierContext, open_memory_tier
from goodput.checkpoint.policy import (
    EveryInterval,
    SavePolicy,
    StepSchedule,
    tier_policy,
)
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.tier import CheckpointTier, Restored
from goodput.errors import CheckpointCorrupt, CheckpointError, SaveFailed

__all__ = ["CheckpointManager", "SaveResult"]

log = logging.getLogger(__name__)

Listener = Callable[..., None]


@dataclass
class _Cadence:
    """A tier's save policy, and across ranks under a time-based policy, the schedule rank 0 decides it by."""

    policy: SavePolicy
    schedule: StepSchedule | None


class CheckpointManager:
    """Saves and restores a :class:`TrainingState` under ``config.root``.

    Args:
        config: where, how and how often.
        state: the training state to save and restore.
        process_group: the training group (None: the default group, or a single process).
        on_event: called as ``on_event(name, **fields)`` for ``checkpoint_stall`` (phase start/end),
            ``checkpoint_durable`` and ``checkpoint_failed``.
        clock: monotonic seconds (injectable for tests of the policy).
    """

    def __init__(
        self,
        config: CheckpointConfig,
        state: TrainingState,
        *,
        process_group: Any = None,
        on_event: Listener | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.state = state
        self._clock = clock
        self._listeners: list[Listener] = [on_event] if on_event is not None else []
        self._layout = CheckpointLayout(config.required_root(), config.storage_options)
        self._coll = Collectives(process_group)
        self.rank, self.world_size = self._coll.rank, self._coll.world_size
        policy = self._make_policy()
        # time-based policies across ranks: rank 0 turns the interval into step numbers (one broadcast per save)
        distributed = self._coll.distributed
        self._cadence = _Cadence(
            policy, StepSchedule(policy) if distributed and isinstance(policy, EveryInterval) else None
        )
        token = self._coll.bcast(uuid.uuid4().hex[:12] if self.rank == 0 else None)
        self.durable = DurableTier(
            config, state, self._layout, self._coll, policy=policy, token=token, emit=self._emit, clock=clock
        )
        self._last_step: int | None = None  # the newest step given to maybe_save/save, for close()'s check
        self._closed = False
        if self.rank == 0:
            self._check_root(token)
        self.memory: MemoryCheckpointer | None = None
        self._memory_group: Any = None
        self._memory_cadence: _Cadence | None = None
        self._memory_due = False
        self._memory_forced: int | None = None  # a step the memory tier saves only because the durable does
        self._deferred: int | None = None  # the first step a time-based save waited at for the one in flight
        if config.memory is not None:
            self.memory, memory_policy, self._memory_group = open_memory_tier(
                TierContext(
                    config=config,
                    state=state,
                    layout=self._layout,
                    rank=self.rank,
                    world_size=self.world_size,
                    ranks=self._coll.ranks,
                    distributed=distributed,
                    bcast=self._coll.bcast,
                    all_gather=self._coll.all_gather,
                    emit=self._emit,
                    clock=self._clock,
                    durable_policy=policy,
                )
            )
            schedule = (
                StepSchedule(memory_policy, nearest=True)
                if distributed and isinstance(memory_policy, EveryInterval)
                else None
            )
            self._memory_cadence = _Cadence(memory_policy, schedule)
            self.durable.staged = self.memory
        self.tiers: list[CheckpointTier] = [t for t in (self.memory, self.durable) if t is not None]
        self._coll.barrier()

    # ---- plumbing -------------------------------------------------------------------------------------------
    def _check_root(self, token: str) -> None:
        """Rank 0, before any training: remove crashed saves' folders and, under a remote root, write and remove
        a probe object. Credentials the store refuses (none, wrong ones, read-only) stop the job here with one
        line (``AccessRefused``, fatal: no restarted attempt can fix them), not at every attempt or first save."""
        config = self.config
        with refusals_named(config.root, config.storage_options, verb="write checkpoints to"):
            self._layout.clean_partials(stale_after=config.seconds("partial_grace"))
            if not self._layout.local:
                probe = self._layout.join(f".goodput-probe-{token}")
                self._layout.fs.pipe_file(probe, b"")
                self._layout.fs.rm_file(probe)

    def _make_policy(self) -> SavePolicy:
        cfg = self.config
        return tier_policy(
            cfg,
            cfg.every_steps,
            cfg.every_seconds,
            world_size=self.world_size,
            on_change=lambda interval, why, stall, persist: self._emit(
                "checkpoint_interval",
                interval_seconds=interval,
                reason=why,
                stall_seconds=stall,
                persist_seconds=persist,
            ),
        )

    @property
    def decisions(self) -> int:
        """How many times the ranks asked rank 0 whether to save (time-based policies across ranks)."""
        schedule = self._cadence.schedule
        return schedule.decisions if schedule is not None else 0

    @property
    def policy(self) -> SavePolicy:
        """The save policy in use (``AutoInterval.observe_mtbf`` feeds it observed failures)."""
        return self._cadence.policy

    @property
    def memory_policy(self) -> SavePolicy | None:
        """The memory tier's save policy (None without a memory tier)."""
        return self._memory_cadence.policy if self._memory_cadence is not None else None

    @property
    def results(self) -> list[SaveResult]:
        """Every durable save this manager committed, oldest first."""
        return self.durable.results

    def to_purge(self, rows: list[CheckpointInfo]) -> list[CheckpointInfo]:
        """Which committed checkpoints retention removes: all but the newest ``keep_last`` and the
        ``keep_every`` multiples and the pinned one. The newest committed one is never among them."""
        return to_purge(self.config, rows, pinned=self.durable.retention.pinned)

    def pin(self, step: int) -> None:
        """Keep, in every tier, the newest checkpoint at or before ``step`` until a later pin, however many newer
        saves retention would keep instead: a rollback to it must still find it (the numeric guard pins its
        last check where every replica agreed)."""
        self.durable.retention.pinned = step
        if self.memory is not None:
            self.memory.store.pin(step)

    def add_listener(self, listener: Listener) -> None:
        """Also call ``listener(name, **fields)`` on every checkpoint event."""
        self._listeners.append(listener)

    def _emit(self, name: str, **fields: Any) -> None:
        for listener in self._listeners:
            try:
                listener(name, **fields)
            except Exception:  # a broken listener must not break a save
                log.exception("checkpoint event listener failed on %s", name)

    # ---- saving ---------------------------------------------------------------------------------------------
    def should_save(self, step: int, now: float | None = None) -> bool:
        """Whether the policy wants ``step`` saved; every rank gets the same answer.

        Step-based policies need no communication. Time-based ones (across ranks) ask rank 0 only at decision
        steps: at each, rank 0 answers and names the next decision step from its measured step time, so there is
        about one broadcast per save, not one per step. The memory tier, when configured, is decided the same
        way by a schedule of its own, and also saves whenever the durable tier does (the durable save then
        writes the memory tier's staged copy; that memory save's stall counts as the durable save's cost in
        the ``auto`` planner, which would otherwise see a durable save as nearly free and save too often).
        """
        now = self._clock() if now is None else now
        due = self._decide(self._cadence, step, now)
        if self._memory_cadence is not None:
            memory = self._decide(self._memory_cadence, step, now)
            self._memory_due = memory or due
            self._memory_forced = step if due and not memory else None
        return due

    def _decide(self, cadence: _Cadence, step: int, now: float) -> bool:
        schedule = cadence.schedule
        if schedule is None:
            return bool(cadence.policy.due(step, now)) and not self._busy(cadence, step)
        ctl = self._coll.ctl
        due = False
        if schedule.in_flight is not None and schedule.in_flight[0] <= step:
            _, work, answer = schedule.in_flight  # sent at the step before, by now long arrived
            schedule.in_flight = None
            work.wait()
            due = bool(answer[0])
            schedule.agreed(int(answer[1]))
        if not schedule.pending(
            step
        ):  # a decision step: rank 0 decides the next step, sent in the background
            decision = schedule.decide(step + 1, now) if self.rank == 0 else (False, 0)
            if decision[0] and self._busy(cadence, step + 1):
                decision = (False, step + 1)  # ask again at the next step
            answer = torch.tensor([int(decision[0]), decision[1]], dtype=torch.int64)
            work = dist.broadcast(answer, src=dist.get_global_rank(ctl, 0), group=ctl, async_op=True)
            schedule.in_flight = (step + 1, work, answer)
        return due

    def _busy(self, cadence: _Cadence, step: int) -> bool:
        """Whether a time-based durable save must wait because the previous one is still in flight.

        Saving then would block training until the previous save is durable (one save in flight at most), so
        saves would queue behind a slow store; instead the save waits for the step after the previous one is
        durable, and the interval in effect widens to the time a save takes (``auto`` also plans for it once
        the slow save is measured). Step-based policies keep their exact steps and wait instead.
        """
        busy = cadence is self._cadence and isinstance(cadence.policy, EveryInterval) and self.durable.busy()
        if busy and self._deferred is None:
            log.info(
                "a save is due at step %d while the previous one is still in flight: saving after it", step
            )
        self._deferred = step if busy else None
        return busy

    def should_save_memory(self, step: int) -> bool:
        """Whether the memory tier saves ``step`` (decided by the last ``should_save`` call, for that step)."""
        return self.memory is not None and self._memory_due and step not in self.memory.committed[:1]

    def save_memory(self, step: int) -> float:
        """Save ``step`` to the memory tier (blocks only for the staging copy); returns the blocked seconds."""
        self._check_open()
        assert self.memory is not None and self._memory_cadence is not None, "no memory tier configured"
        self._memory_cadence.policy.saved(step, self._clock())
        stall = self.memory.save(step)
        if self._memory_forced == step:  # saved only because the durable tier saves this step
            self.durable.charge(step, stall)
        return stall

    def maybe_save(self, step: int, now: float | None = None) -> SaveResult | None:
        """``save(step)`` when ``should_save(step, now)`` says so; None otherwise."""
        self._last_step = step
        return self.save(step) if self.should_save(step, now) else None

    def save(self, step: int) -> SaveResult:
        """Save the state as ``step``; blocks only for the strategy's blocking part (``dcp_async``: staging).

        Waits first for a previous save still in flight (at most one; the wait counts as this save's stall).
        A step already committed is skipped.

        Raises:
            SaveFailed: this (synchronous) save failed, or the previous asynchronous one did (raised after this
                call saved, or started saving, ``step``: a failure never costs the next checkpoint). The
                previous checkpoint is untouched and training may go on.
        """
        self._check_open()
        self._last_step = step
        quiet_single_process()
        return self.durable.save(step)

    def wait(self) -> SaveResult | None:
        """Block until the save in flight (if any) is durable; returns its result.

        Raises:
            SaveFailed: when that save failed.
        """
        return self.durable.wait()

    # ---- restoring ------------------------------------------------------------------------------------------
    def restore_latest(self, *, at_most: int | None = None) -> int | None:
        """Load the newest valid checkpoint into the state; returns its step, or None when there is none.

        A checkpoint that fails verification or loading is skipped with a warning naming the file, and the
        next older one is tried. Committed checkpoints of which none loads stop the run (below), unless
        ``config.fresh_start_allowed()``; folders of saves that never committed are no checkpoints at all.
        The tiers are asked fastest first; a faster one restores only a step at least as new as the newest
        durable one.

        ``at_most``: a rollback in place (``goodput.run.numeric``) loads no step newer than this one, and
        discards every newer checkpoint of both tiers: they belong to the timeline being abandoned (after a
        corrupted replica, they may hold its corruption), and the redone steps save those steps again.

        Raises:
            StateMismatch: the newest valid checkpoint does not fit the model/optimizer (names key and shapes).
            NoValidCheckpoint: committed checkpoints exist (durable ones, or memory-tier parts whose check
                failed) and none of them could be loaded, and a fresh start is not allowed.
        """
        self._check_open()
        quiet_single_process()
        self.wait()
        floor = self.durable.find(at_most=at_most)
        start = self._clock()
        for tier in self.tiers:
            found = tier.restore(at_least=None if tier is self.durable else floor, at_most=at_most)
            if found is not None:
                if tier is self.durable:
                    self._last_step = found.step
                else:
                    self.durable.reader.warn_skipped(self.durable.skipped)
                return self._restored(found, start)
        none_loaded(
            self.config,
            self.durable.reader,
            self.durable.skipped,
            self.memory.failures if self.memory is not None else [],
        )
        if self.memory is not None and self.memory.overwritten:
            raise CheckpointCorrupt(
                "a damaged memory-tier part was read into the live state and no other checkpoint could be"
                " loaded over it; restart the job (the damaged part is discarded: it starts from the beginning)"
            )
        return None

    def _restored(self, found: Restored, start: float) -> int:
        step = found.step
        self.state.step = step
        for cadence in (self._cadence, self._memory_cadence):
            if cadence is not None:
                cadence.policy.saved(step, self._clock())
        for cadence in (self._cadence, self._memory_cadence):
            if cadence is not None and cadence.schedule is not None:
                cadence.schedule.reset()
        seconds = self._clock() - start
        self._emit("checkpoint_restored", step=step, tier=found.tier, source=found.source, seconds=seconds)
        return step

    # ---- lifetime -------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this CheckpointManager is closed")

    def close(self, step: int | None = None, *, finished: bool = True, warn: bool = True) -> None:
        """Save the final step, wait until the last save is durable and retention has finished; release
        buffers and groups.

        Args:
            step: the run's final step: saved first unless it is already committed, so the end of the run is
                not lost between two scheduled saves (every rank passes the same step). None saves nothing new
                and warns when the newest step given to ``maybe_save``/``save`` has no checkpoint.

        ``finished``: the run is over, so its memory-tier folder on this node is removed (False keeps it, e.g.
        when the job stops to be resumed). ``warn=False``: the caller reports an unsaved end in its own words.

        Raises:
            SaveFailed: when the final save or the last one in flight failed (everything is released anyway).
        """
        if self._closed:
            return
        try:
            previous = self.durable.settle()  # a failure there is raised after the final save, not instead
            if step is not None:
                self.save(step)
            self.wait()
            if isinstance(previous, SaveFailed):
                raise previous
            committed = self.durable.committed
            if warn and step is None and self._last_step is not None and self._last_step not in committed:
                newest = max(committed, default=None)
                log.warning(
                    "closing without saving step %d (newest checkpoint: %s): pass close(step=%d) to save "
                    "the end of the run",
                    self._last_step,
                    "none" if newest is None else f"step {newest}",
                    self._last_step,
                )
        finally:
            self._closed = True
            for tier in self.tiers:
                tier.close(finished=finished)
            self._release_groups(join=self._settle_schedules())

    def _settle_schedules(self) -> bool:
        """Wait briefly for each schedule's decision in flight; False when one never arrived."""
        settled = True
        for cadence in (self._cadence, self._memory_cadence):
            schedule = cadence.schedule if cadence is not None else None
            if schedule is not None and schedule.in_flight is not None:
                # every rank sent it at the same step; a dead peer's cannot arrive: do not wait long
                try:
                    schedule.in_flight[1].wait(timeout=datetime.timedelta(seconds=10))
                except Exception:
                    settled = False
                schedule.in_flight = None
        return settled

    def _release_groups(self, *, join: bool) -> None:
        """Destroy the manager's groups; with ``join`` (no collective of ours left running on them) also drop
        every reference to them, so their gloo threads end here and not during the interpreter's exit, where a
        thread finishing the last collective aborts the process (see ``_groups``)."""
        coll = self._coll
        groups = [g for g in (coll.ctl, coll.io, self._memory_group) if g is not None]
        if not join:  # a join would wait for the stuck collective: unregister only
            for group in groups:
                dist.destroy_process_group(group)
            return
        coll.take_groups()
        self._memory_group = None
        self.durable.drop_group()
        if self.memory is not None:
            self.memory.drop_group()
        release_groups(groups)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(finished=exc[0] is None)  # no final save: after an exception the state may be mid-step
