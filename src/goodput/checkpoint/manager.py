"""``CheckpointManager``: when to save, one save in flight, commit, retention, and restore of the newest valid.

Every rank makes the same calls in the same order (``should_save``, ``save``, ``restore_latest``, ``close``).
The manager runs its collectives on two gloo groups of its own, made from the training group's ranks: one for
the training thread's decisions, one for the writes and commits that may run in the background, so checkpoint
traffic never interleaves with training collectives or with each other.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException

from goodput._storage_errors import refusals_named
from goodput.checkpoint._groups import release_groups
from goodput.checkpoint._restoring import _RestorePath
from goodput.checkpoint._retention import _Retention
from goodput.checkpoint._saving import SaveResult, _quiet_single_process, _raiser, _SavePath
from goodput.checkpoint.config import CheckpointConfig
from goodput.checkpoint.layout import CheckpointLayout
from goodput.checkpoint.memory.checkpointer import MemoryCheckpointer
from goodput.checkpoint.memory.setup import TierContext, open_memory_tier
from goodput.checkpoint.policy import AutoInterval, EveryInterval, EverySteps, SavePolicy, StepSchedule
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.strategy import Completion, SaveContext, make_strategy
from goodput.errors import CheckpointError, SaveFailed
from goodput.faults import fault_point

__all__ = ["CheckpointManager", "SaveResult"]

log = logging.getLogger(__name__)

Listener = Callable[..., None]


class CheckpointManager(_SavePath, _RestorePath, _Retention):
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
        self._layout = CheckpointLayout(config.root, config.storage_options)
        self._dist = dist.is_available() and dist.is_initialized()
        ranks = (
            dist.get_process_group_ranks(process_group) if self._dist and process_group is not None else None
        )
        self._ctl = dist.new_group(ranks=ranks, backend="gloo") if self._dist else None
        self._io = dist.new_group(ranks=ranks, backend="gloo") if self._dist else None
        self.rank = dist.get_rank(self._ctl) if self._dist else 0
        self.world_size = dist.get_world_size(self._ctl) if self._dist else 1
        self._checksums = config.checksums(self._layout.local)
        self._algorithm = config.checksum_algorithm(self._layout.local)
        self._ctx = SaveContext(
            self._layout,
            self.rank,
            self.world_size,
            self._io,
            {"async_checkpointer": config.async_checkpointer, "checksum": self._algorithm},
        )
        self._strategy = make_strategy(config.strategy, self._ctx)
        self._policy = self._make_policy()
        # time-based policies across ranks: rank 0 turns the interval into step numbers (one broadcast per save)
        self._schedule = (
            StepSchedule(self._policy) if self._dist and isinstance(self._policy, EveryInterval) else None
        )
        self._token = self._bcast(uuid.uuid4().hex[:12] if self.rank == 0 else None)
        self._committed: set[int] = set()
        self._failed: set[int] = set()  # steps whose committed checkpoint failed to restore (saved over)
        self._last_step: int | None = None  # the newest step given to maybe_save/save, for close()'s check
        self._inflight: Future[SaveResult] | None = None
        self._deferred: int | None = None  # the first step a time-based save waited at for the one in flight
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="goodput-ckpt")
        self._purger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="goodput-purge")
        self._purge: Future[None] | None = None
        self._closed = False
        self.results: list[SaveResult] = []
        self._restore_parts: dict[str, float] = {}
        if self.rank == 0:
            self._check_root()
        self.memory: MemoryCheckpointer | None = None
        self._memory_group: Any = None
        self._memory_policy: SavePolicy | None = None
        self._memory_due = False
        self._memory_forced: int | None = None  # a step the memory tier saves only because the durable does
        self._forced_stall: tuple[int, float] | None = None  # (step, stall) of that memory save
        self._memory_schedule: StepSchedule | None = None
        if config.memory is not None:
            self.memory, self._memory_policy, self._memory_group = open_memory_tier(
                TierContext(
                    config=config,
                    state=state,
                    layout=self._layout,
                    rank=self.rank,
                    world_size=self.world_size,
                    ranks=ranks,
                    distributed=self._dist,
                    bcast=self._bcast,
                    all_gather=self._all_gather,
                    emit=self._emit,
                    clock=self._clock,
                    durable_policy=self._policy,
                )
            )
            if self._dist and isinstance(self._memory_policy, EveryInterval):
                self._memory_schedule = StepSchedule(self._memory_policy, nearest=True)
        self._barrier()

    # ---- plumbing -------------------------------------------------------------------------------------------
    def _check_root(self) -> None:
        """Rank 0, before any training: remove crashed saves' folders and, under a remote root, write and remove
        a probe object. Credentials the store refuses (none, wrong ones, read-only) stop the job here with one
        line (``AccessRefused``, fatal: no restarted attempt can fix them), not at every attempt or first save."""
        config = self.config
        with refusals_named(config.root, config.storage_options, verb="write checkpoints to"):
            self._layout.clean_partials(stale_after=config.seconds("partial_grace"))
            if not self._layout.local:
                probe = self._layout.join(f".goodput-probe-{self._token}")
                self._layout.fs.pipe_file(probe, b"")
                self._layout.fs.rm_file(probe)

    def _make_policy(self) -> SavePolicy:
        cfg = self.config
        if cfg.every_steps is not None:
            return EverySteps(cfg.every_steps)
        if cfg.every_seconds is not None:
            return EveryInterval(cfg.every_seconds)
        return AutoInterval(
            mtbf=cfg.prior_mtbf(self.world_size),
            max_interval=cfg.seconds("max_interval"),
            restart=cfg.seconds("restart"),
            detect=cfg.seconds("detect"),
            on_change=lambda interval, why: self._emit(
                "checkpoint_interval", interval_seconds=interval, reason=why
            ),
        )

    @property
    def decisions(self) -> int:
        """How many times the ranks asked rank 0 whether to save (time-based policies across ranks)."""
        return self._schedule.decisions if self._schedule is not None else 0

    @property
    def policy(self) -> SavePolicy:
        """The save policy in use (``AutoInterval.observe_mtbf`` feeds it observed failures)."""
        return self._policy

    @property
    def memory_policy(self) -> SavePolicy | None:
        """The memory tier's save policy (None without a memory tier)."""
        return self._memory_policy

    def add_listener(self, listener: Listener) -> None:
        """Also call ``listener(name, **fields)`` on every checkpoint event."""
        self._listeners.append(listener)

    def _emit(self, name: str, **fields: Any) -> None:
        for listener in self._listeners:
            try:
                listener(name, **fields)
            except Exception:  # a broken listener must not break a save
                log.exception("checkpoint event listener failed on %s", name)

    def _bcast(self, value: Any, group: Any = None) -> Any:
        if not self._dist:
            return value
        pg: Any = group or self._ctl
        box = [value]
        dist.broadcast_object_list(box, src=dist.get_global_rank(pg, 0), group=pg)
        return box[0]

    def _barrier(self) -> None:
        if self._dist:
            dist.barrier(group=self._ctl)

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
        due = self._decide(self._policy, self._schedule, step, now)
        if self._memory_policy is not None:
            memory = self._decide(self._memory_policy, self._memory_schedule, step, now)
            self._memory_due = memory or due
            self._memory_forced = step if due and not memory else None
        return due

    def _decide(self, policy: SavePolicy, schedule: StepSchedule | None, step: int, now: float) -> bool:
        if schedule is None:
            return bool(policy.due(step, now)) and not self._busy(policy, step)
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
            if decision[0] and self._busy(policy, step + 1):
                decision = (False, step + 1)  # ask again at the next step
            answer = torch.tensor([int(decision[0]), decision[1]], dtype=torch.int64)
            src = dist.get_global_rank(self._ctl, 0)
            work = dist.broadcast(answer, src=src, group=self._ctl, async_op=True)
            schedule.in_flight = (step + 1, work, answer)
        return due

    def _busy(self, policy: SavePolicy, step: int) -> bool:
        """Whether a time-based durable save must wait because the previous one is still in flight.

        Saving then would block training until the previous save is durable (one save in flight at most), so
        saves would queue behind a slow store; instead the save waits for the step after the previous one is
        durable, and the interval in effect widens to the time a save takes (``auto`` also plans for it once
        the slow save is measured). Step-based policies keep their exact steps and wait instead.
        """
        inflight = self._inflight
        busy = (
            policy is self._policy
            and isinstance(policy, EveryInterval)
            and inflight is not None
            and not inflight.done()
        )
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
        assert self.memory is not None and self._memory_policy is not None, "no memory tier configured"
        self._memory_policy.saved(step, self._clock())
        stall = self.memory.save(step)
        if self._memory_forced == step:  # saved only because the durable tier saves this step
            self._forced_stall = (step, stall)
        return stall

    def maybe_save(self, step: int, now: float | None = None) -> SaveResult | None:
        """``save(step)`` when ``should_save(step, now)`` says so; None otherwise."""
        self._last_step = step
        return self.save(step) if self.should_save(step, now) else None

    def save(self, step: int) -> SaveResult:
        """Save the state as ``step``; blocks only for the strategy's blocking part (``dcp_async``: staging).

        Waits first for a previous save still in flight (at most one). A step already committed is skipped.

        Raises:
            SaveFailed: this (synchronous) save failed, or the previous asynchronous one did (then nothing new
                is saved by this call). The previous checkpoint is untouched and training may go on.
        """
        self._check_open()
        self._last_step = step
        _quiet_single_process()
        previous = self._wait_inflight()
        if isinstance(previous, SaveFailed):
            raise previous  # reported once; the next call saves normally
        if step in self._committed:
            return SaveResult(
                step, self.config.strategy, 0.0, 0.0, self._layout.final_dir(step), None, skipped=True
            )
        now = self._clock()
        self._policy.saved(step, now)
        self._emit("checkpoint_stall", phase="start", step=step)
        start = self._clock()
        self.state.step = step
        if getattr(self._strategy, "writes_later", False):
            return self._save_staged(step, start)
        folder, error, exists = self._begin(step, self._ctl)
        if exists:  # committed by an earlier run that this manager did not restore: never overwrite it
            self._committed.add(step)
            self._emit("checkpoint_stall", phase="end", step=step, seconds=self._clock() - start)
            return SaveResult(
                step, self.config.strategy, self._clock() - start, 0.0, folder, None, skipped=True
            )
        completion: Completion
        if error:
            completion = _raiser(OSError(error))
        else:
            try:
                fault_point("checkpoint_begin", step)  # this rank enters the save; its peers may be inside
                completion = self._strategy.save(self.state, folder, self._ctx)
            except CheckpointException as err:  # DCP raises its failures on every rank alike
                completion = _raiser(err)
            except Exception as err:
                if self.world_size > 1:
                    raise self._alone(step, err, self._clock() - start) from err
                completion = _raiser(err)
        fault_point("checkpoint_write", step)  # written (or staged), not committed
        if self._strategy.is_async:
            stall = self._clock() - start
            self._emit("checkpoint_stall", phase="end", step=step, seconds=stall)
            self._inflight = self._finisher.submit(self._finish, step, folder, completion, start, stall)
            return SaveResult(step, self.config.strategy, stall)
        return self._finish(step, folder, completion, start, None)

    # ---- lifetime -------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this CheckpointManager is closed")

    def close(self, step: int | None = None, *, finished: bool = True) -> None:
        """Save the final step, wait until the last save is durable and retention has finished; release
        buffers and groups.

        Args:
            step: the run's final step: saved first unless it is already committed, so the end of the run is
                not lost between two scheduled saves (every rank passes the same step). None saves nothing new
                and warns when the newest step given to ``maybe_save``/``save`` has no checkpoint.

        ``finished``: the run is over, so its memory-tier folder on this node is removed (False keeps it, e.g.
        when the job stops to be resumed).

        Raises:
            SaveFailed: when the final save or the last one in flight failed (everything is released anyway).
        """
        if self._closed:
            return
        try:
            previous = self._wait_inflight()  # a failure there is raised after the final save, not instead
            if step is not None:
                self.save(step)
            self.wait()
            if isinstance(previous, SaveFailed):
                raise previous
            if step is None and self._last_step is not None and self._last_step not in self._committed:
                newest = max(self._committed, default=None)
                log.warning(
                    "closing without saving step %d (newest checkpoint: %s): pass close(step=%d) to save "
                    "the end of the run",
                    self._last_step,
                    "none" if newest is None else f"step {newest}",
                    self._last_step,
                )
        finally:
            self._closed = True
            if self.memory is not None:
                self.memory.close(finished=finished)
            if self._purge is not None:
                self._purge.result()
            self._finisher.shutdown(wait=True)
            self._purger.shutdown(wait=True)
            self._strategy.close()
            settled = True
            for schedule in (self._schedule, self._memory_schedule):
                if schedule is not None and schedule.in_flight is not None:
                    # every rank sent it at the same step; a dead peer's cannot arrive: do not wait long
                    try:
                        schedule.in_flight[1].wait(timeout=datetime.timedelta(seconds=10))
                    except Exception:
                        settled = False
                    schedule.in_flight = None
            self._release_groups(join=settled)

    def _release_groups(self, *, join: bool) -> None:
        """Destroy the manager's groups; with ``join`` (no collective of ours left running on them) also drop
        every reference to them, so their gloo threads end here and not during the interpreter's exit, where a
        thread finishing the last collective aborts the process (see ``_groups``)."""
        groups = [g for g in (self._ctl, self._io, self._memory_group) if g is not None]
        if not join:  # a join would wait for the stuck collective: unregister only, as before
            for group in groups:
                dist.destroy_process_group(group)
            return
        self._ctl = self._io = self._memory_group = None
        self._ctx.group = None
        if self.memory is not None:
            self.memory.group = self.memory.link.group = None
        release_groups(groups)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(finished=exc[0] is None)  # no final save: after an exception the state may be mid-step
