"""``CheckpointManager``: when each tier saves, one save in flight, and restore of the newest valid step.

Every rank makes the same calls in the same order (``maybe_save``, ``save``, ``restore_latest``, ``close``).
The manager holds a list of tiers behind one protocol (``tier.py``), fastest first: those the config asks for
(``_tiers.py``: the memory tier when configured, then the durable tier, the run's record) after any a caller
adds. It decides from each tier's cadence when it saves and asks the fastest first at restore; the tiers run
their collectives on two gloo groups of the manager's own (``_collectives.py``), made from the training group's
ranks, and on groups of their own.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from goodput.checkpoint._collectives import Collectives
from goodput.checkpoint._final_save import final_save_timeout, gave_up, pause_before, trying_again
from goodput.checkpoint._groups import release_groups
from goodput.checkpoint._saving import SaveResult, quiet_single_process
from goodput.checkpoint._tiers import open_tiers
from goodput.checkpoint.config import CheckpointConfig
from goodput.checkpoint.durable._restoring import none_loaded, warn_damage
from goodput.checkpoint.durable.manifest import CheckpointInfo
from goodput.checkpoint.policy import EveryInterval, SavePolicy, StepSchedule
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.tier import CheckpointTier, Damage, Restored
from goodput.errors import CheckpointCorrupt, CheckpointError, SaveFailed

__all__ = ["CheckpointManager", "SaveResult"]

log = logging.getLogger(__name__)

Listener = Callable[..., None]
Guard = Callable[[], AbstractContextManager[None]]


@dataclass
class _Timing:
    """A tier, and across ranks under a time-based policy, the schedule rank 0 decides its saves by."""

    tier: CheckpointTier
    schedule: StepSchedule | None
    deferred: int | None = None  # the first step a deferred save waited at for the one in flight

    @property
    def policy(self) -> SavePolicy:
        return self.tier.cadence.policy


class CheckpointManager:
    """Saves and restores a :class:`TrainingState` under ``config.root``.

    Args:
        config: where, how and how often.
        state: the training state to save and restore.
        process_group: the training group (None: the default group, or a single process).
        on_event: called as ``on_event(name, **fields)`` for ``checkpoint_stall`` (phase start/end),
            ``checkpoint_durable`` and ``checkpoint_failed``.
        clock: monotonic seconds (injectable for tests of the policy).
        tiers: more tiers (``CheckpointTier``), fastest first, kept before those the config asks for.
        generation_over: whether the group's generation is over (warm restarts): a save in flight is left.
    """

    def __init__(
        self,
        config: CheckpointConfig,
        state: TrainingState,
        *,
        process_group: Any = None,
        on_event: Listener | None = None,
        clock: Callable[[], float] = time.monotonic,
        tiers: Sequence[CheckpointTier] = (),
        generation_over: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        self.state = state
        self._clock = clock
        self._final_timeout = final_save_timeout()  # read now: a bad value stops the job before it trains
        self._listeners: list[Listener] = [on_event] if on_event is not None else []
        self._coll = Collectives(process_group, over=generation_over)
        self.rank, self.world_size = self._coll.rank, self._coll.world_size
        faster, self._record = open_tiers(config, state, self._coll, emit=self._emit, clock=clock)
        self.tiers: list[CheckpointTier] = [*tiers, *faster, self._record]
        # time-based policies across ranks: rank 0 turns the interval into step numbers (one broadcast per save)
        self._timings = [_Timing(tier, self._schedule(tier)) for tier in self.tiers]
        self._last_step: int | None = None  # the newest step given to maybe_save/save, for close()'s check
        self._closed = False
        self._coll.barrier()

    # ---- plumbing -------------------------------------------------------------------------------------------
    def _schedule(self, tier: CheckpointTier) -> StepSchedule | None:
        policy = tier.cadence.policy
        if not self._coll.distributed or not isinstance(policy, EveryInterval):
            return None
        return StepSchedule(policy, nearest=tier.cadence.nearest)

    def tier(self, name: str) -> CheckpointTier | None:
        """The tier called ``name`` (None when there is none)."""
        return next((tier for tier in self.tiers if tier.name == name), None)

    @property
    def decisions(self) -> int:
        """How many times the ranks asked rank 0 whether the run's record saves (time-based policies)."""
        schedule = self._timings[-1].schedule
        return schedule.decisions if schedule is not None else 0

    @property
    def policy(self) -> SavePolicy:
        """The run's record's save policy (``AutoInterval.observe_mtbf`` feeds it observed failures)."""
        return self._record.cadence.policy

    @property
    def committed(self) -> list[int]:
        """The steps the run's record holds committed, newest first."""
        return self._record.committed

    @property
    def results(self) -> list[SaveResult]:
        """Every save of the run's record this manager committed, oldest first."""
        return self._record.results

    def to_purge(self, rows: list[CheckpointInfo]) -> list[CheckpointInfo]:
        """Which committed checkpoints retention removes: all but the newest ``keep_last`` and the
        ``keep_every`` multiples and the pinned one. The newest committed one is never among them."""
        return self._record.to_purge(rows)

    def pin(self, step: int) -> None:
        """Keep, in every tier, the newest checkpoint at or before ``step`` until a later pin, however many newer
        saves retention would keep instead: a rollback to it must still find it (the numeric guard pins its
        last check where every replica agreed)."""
        for tier in self.tiers:
            tier.pin(step)

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
        """Whether the run's record (the durable tier) saves ``step``; every rank gets the same answer.

        Asks every tier's cadence once for ``step`` (``maybe_save`` does this and saves the tiers due).
        """
        return self._due(step, now)[0][-1]

    def _due(self, step: int, now: float | None) -> tuple[list[bool], dict[int, int]]:
        """Which tiers save ``step``, and for a tier saving only because a slower one does, that slower one.

        Step-based policies need no communication. Time-based ones (across ranks) ask rank 0 only at decision
        steps: at each, rank 0 answers and names the next decision step from its measured step time, so there is
        about one broadcast per save, not one per step. A tier also saves whenever a slower one does (the slower
        one then writes the faster one's staged copy); that save's stall counts as the slower save's cost in
        the ``auto`` planner, which would otherwise see such a save as nearly free and save too often.
        """
        now = self._clock() if now is None else now
        own = [False] * len(self._timings)
        for i in reversed(range(len(self._timings))):  # slowest first: the order every rank decides in
            own[i] = self._decide(self._timings[i], step, now)
        due = [any(own[i:]) for i in range(len(own))]
        forced = {i: own.index(True, i) for i in range(len(own)) if due[i] and not own[i]}
        return due, forced

    def _decide(self, timing: _Timing, step: int, now: float) -> bool:
        schedule = timing.schedule
        if schedule is None:
            return bool(timing.policy.due(step, now)) and not self._busy(timing, step)
        ctl = self._coll.ctl
        due = False
        if schedule.in_flight is not None and schedule.in_flight[0] <= step:
            _, work, answer = schedule.in_flight  # sent at the step before, by now long arrived
            schedule.in_flight = None
            work.wait()
            due = bool(answer[0])
            schedule.agreed(int(answer[1]))
        if not schedule.pending(step):  # a decision step: rank 0 decides the next one, sent in the background
            decision = schedule.decide(step + 1, now) if self.rank == 0 else (False, 0)
            if decision[0] and self._busy(timing, step + 1):
                decision = (False, step + 1)  # ask again at the next step
            answer = torch.tensor([int(decision[0]), decision[1]], dtype=torch.int64)
            work = dist.broadcast(answer, src=dist.get_global_rank(ctl, 0), group=ctl, async_op=True)
            schedule.in_flight = (step + 1, work, answer)
        return due

    def _busy(self, timing: _Timing, step: int) -> bool:
        """Whether a time-based save of a tier that ``defers`` must wait because its previous one is in flight.

        Saving then would block training until the previous save is done (one save in flight at most), so
        saves would queue behind a slow store; instead the save waits for the step after the previous one is
        done, and the interval in effect widens to the time a save takes (``auto`` also plans for it once
        the slow save is measured). Step-based policies keep their exact steps and wait instead.
        """
        tier = timing.tier
        busy = tier.cadence.defers and isinstance(timing.policy, EveryInterval) and tier.busy()
        if busy and timing.deferred is None:
            log.info(
                "a %s save is due at step %d while the previous one is still in flight: saving after it",
                tier.name,
                step,
            )
        timing.deferred = step if busy else None
        return busy

    def maybe_save(
        self, step: int, now: float | None = None, *, guard: Guard | None = None
    ) -> SaveResult | None:
        """Training finished ``step``: save it to every tier whose cadence says so, fastest first.

        ``guard``: each save runs inside ``guard()`` (``goodput.Run``: a phase its watchdog allows longer than
        a step). Returns the run's record's ``save`` result when it saved, else None.

        Raises:
            SaveFailed: as ``save`` (the faster tiers saved ``step`` first).
        """
        self._check_open()
        self._last_step = step
        due, forced = self._due(step, now)
        result = None
        for i, tier_due in enumerate(due):
            if tier_due:
                with guard() if guard is not None else contextlib.nullcontext():
                    if i == len(due) - 1:
                        result = self.save(step)
                    else:
                        self._save_faster(i, step, forced.get(i))
        return result

    def _save_faster(self, i: int, step: int, forced_by: int | None) -> None:
        began = self._clock()
        self.tiers[i].save(step)
        if forced_by is not None:  # saved only because a slower tier saves this step
            self.tiers[forced_by].charge(step, self._clock() - began)

    def save(self, step: int) -> SaveResult:
        """Save the state as ``step`` to the run's record; blocks only for the strategy's blocking part
        (``dcp_async``: staging).

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
        return self._record.save(step)

    def wait(self) -> SaveResult | None:
        """Block until the save in flight (if any) is durable; returns its result.

        Raises:
            SaveFailed: when that save failed.
        """
        return self._record.wait()

    # ---- restoring ------------------------------------------------------------------------------------------
    def restore_latest(self, *, at_most: int | None = None) -> int | None:
        """Load the newest valid checkpoint into the state; returns its step, or None when there is none.

        A checkpoint that fails verification or loading is skipped with a warning naming the file, and the
        next older one is tried. Committed checkpoints of which none loads stop the run (below), unless
        ``config.fresh_start_allowed()``; folders of saves that never committed are no checkpoints at all.
        Every tier lists what it holds; they are asked fastest first, and a faster one restores only a step at
        least as new as the newest a slower one lists.

        ``at_most``: a rollback in place (``goodput.run.numeric``) loads no step newer than this one, and
        discards every newer checkpoint of every tier: they belong to the timeline being abandoned (after a
        corrupted replica, they may hold its corruption), and the redone steps save those steps again.

        Raises:
            StateMismatch: the newest valid checkpoint does not fit the model/optimizer (names key and shapes).
            NoValidCheckpoint: committed checkpoints exist (durable ones, or memory-tier parts whose check
                failed) and none of them could be loaded, and a fresh start is not allowed.
        """
        self._check_open()
        quiet_single_process()
        for tier in self.tiers:  # a save in flight that failed was logged there: restore what is committed
            with contextlib.suppress(SaveFailed):
                tier.wait()
        start = self._clock()
        newest = [tier.find(at_most=at_most) for tier in reversed(self.tiers)][::-1]  # the record lists first
        for i, tier in enumerate(self.tiers):
            floor = max((step for step in newest[i + 1 :] if step is not None), default=None)
            found = tier.restore(at_least=floor)
            if found is not None:
                warn_damage(self._damages(), self.rank)
                if tier is self._record:  # close() warns when the last step is not among the record's
                    self._last_step = found.step
                return self._restored(found, start)
        damages = self._damages()
        none_loaded(self.config, self._record.root, damages, rank=self.rank)
        overwritten = [name for name, damage in damages if damage.overwritten]
        if overwritten:
            raise CheckpointCorrupt(
                f"a damaged {overwritten[0]}-tier part was read into the live state and no other checkpoint could"
                " be loaded over it; restart the job (the damaged part is discarded: it starts from the beginning)"
            )
        return None

    def _damages(self) -> list[tuple[str, Damage]]:
        """Each tier's name and what it could not load, the run's record first."""
        return [(tier.name, tier.damage()) for tier in reversed(self.tiers)]

    def _restored(self, found: Restored, start: float) -> int:
        step = found.step
        self.state.step = step
        for timing in self._timings:
            timing.policy.saved(step, self._clock())
        for timing in self._timings:
            if timing.schedule is not None:
                timing.schedule.reset()
        seconds = self._clock() - start
        self._emit("checkpoint_restored", step=step, tier=found.tier, source=found.source, seconds=seconds)
        return step

    # ---- lifetime -------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this CheckpointManager is closed")

    def close(
        self, step: int | None = None, *, finished: bool = True, warn: bool = True, guard: Guard | None = None
    ) -> None:
        """Save the final step, wait until the last save is durable and retention has finished; release
        buffers and groups.

        Args:
            step: the run's final step: saved first unless it is already committed, so the end of the run is
                not lost between two scheduled saves (every rank passes the same step); a refused save of it is
                tried again for up to ``$GOODPUT_FINAL_SAVE_TIMEOUT`` seconds (``_final_save``), and an earlier
                failed save no longer matters once it is committed. None saves nothing new and warns when the
                newest step given to ``maybe_save``/``save`` has no checkpoint.
            guard: each try of the final save runs inside ``guard()`` (``goodput.Run``: the watchdog's phase).

        ``finished``: the run is over, so its memory-tier folder on this node is removed (False keeps it, e.g.
        when the job stops to be resumed). ``warn=False``: the caller reports an unsaved end in its own words.

        Raises:
            SaveFailed: the final save still failed when the bound was spent (its one line says so), or, with
                no ``step``, the save in flight failed (everything is released anyway).
        """
        if self._closed:
            return
        try:
            previous = self._record.settle()  # with no final step, raised once the rest is done
            if step is not None:
                self._save_final(step, guard)
                previous = None  # the end is saved: an earlier failure was reported where it happened
            self.wait()
            if isinstance(previous, SaveFailed):
                raise previous
            committed = self.committed
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

    def _save_final(self, step: int, guard: Guard | None) -> None:
        """Save ``step`` until it is durable, trying again while the bound lasts: every rank sees the same
        ``SaveFailed`` (agreed) and rank 0's clock decides each pause. A pause is ``checkpoint_stall``."""
        began, tries = self._clock(), 0
        while True:
            tries += 1
            try:
                with guard() if guard is not None else contextlib.nullcontext():
                    if step not in self.committed:
                        self.save(step)
                    self.wait()
                return
            except SaveFailed as err:
                failed = err
            left = self._final_timeout - (self._clock() - began)
            pause = self._coll.bcast(pause_before(tries, left))
            store = (step, self.config.root, self.config.storage_options, failed)
            if pause is None:
                line = gave_up(*store, tries, max(self.committed, default=None))
                if self.rank == 0:
                    log.error("%s", line)
                raise SaveFailed(line, step=step, reason=failed.reason) from failed
            if self.rank == 0:
                log.warning("%s", trying_again(*store, pause, left))
            self._emit("checkpoint_stall", phase="start", step=step, retry=tries)
            time.sleep(pause)
            self._emit("checkpoint_stall", phase="end", step=step, retry=tries, seconds=pause)

    def _settle_schedules(self) -> bool:
        """Wait briefly for each schedule's decision in flight; False when one never arrived."""
        settled = True
        for timing in self._timings:
            schedule = timing.schedule
            if schedule is not None and schedule.in_flight is not None:
                # every rank sent it at the same step; a dead peer's cannot arrive: do not wait long
                try:
                    schedule.in_flight[1].wait(timeout=datetime.timedelta(seconds=10))
                except Exception:
                    settled = False
                schedule.in_flight = None
        return settled

    def _release_groups(self, *, join: bool) -> None:
        """Destroy the manager's and the tiers' groups; with ``join`` (no collective of ours left running on
        them) also drop every reference to them, so their gloo threads end here and not during the interpreter's
        exit, where a thread finishing the last collective aborts the process (see ``_groups``)."""
        coll = self._coll
        groups = [g for g in (coll.ctl, coll.io) if g is not None]
        groups += [g for tier in self.tiers for g in tier.own_groups()]
        if not join:  # a join would wait for the stuck collective: unregister only
            for group in groups:
                dist.destroy_process_group(group)
            return
        coll.take_groups()
        for tier in self.tiers:
            tier.drop_groups()
        release_groups(groups)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(finished=exc[0] is None)  # no final save: after an exception the state may be mid-step
