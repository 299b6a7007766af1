"""``CheckpointManager``: when to save, one save in flight, commit, retention, and restore of the newest valid.

Every rank makes the same calls in the same order (``should_save``, ``save``, ``restore_latest``, ``close``).
The manager runs its collectives on two gloo groups of its own, made from the training group's ranks: one for
the training thread's decisions, one for the writes and commits that may run in the background, so checkpoint
traffic never interleaves with training collectives or with each other.
"""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException

import goodput
from goodput.checkpoint._memory_setup import open_memory_tier
from goodput.checkpoint.config import CheckpointConfig
from goodput.checkpoint.layout import CheckpointInfo, CheckpointLayout, FileEntry, Manifest
from goodput.checkpoint.memory_tier import MemoryCheckpointer
from goodput.checkpoint.policy import AutoInterval, EveryInterval, EverySteps, SavePolicy, StepSchedule
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.strategy import Completion, SaveContext, make_strategy
from goodput.errors import CheckpointCorrupt, CheckpointError, SaveFailed, StateMismatch, StorageError
from goodput.faults import fault_point

__all__ = ["CheckpointManager", "SaveResult"]

log = logging.getLogger(__name__)

Listener = Callable[..., None]

# DCP reports a failure on any rank as CheckpointException, which derives from BaseException.
_FAILURES = (Exception, CheckpointException)


def _quiet_single_process() -> None:
    """Hide DCP's "torch.distributed is disabled ... assuming the intent is to save/load in a single process"
    warning, shown on every save and load of a process without a group: for goodput that is the intent.
    Installed before each save and load (not once at import) so that a caller's ``catch_warnings`` cannot
    drop it; installing an identical filter again replaces it, so the filter list does not grow."""
    warnings.filterwarnings(
        "ignore", message="torch.distributed is disabled, unavailable or uninitialized", category=UserWarning
    )


@dataclass(frozen=True)
class SaveResult:
    """What one save cost.

    Attributes:
        step: the step saved.
        strategy: the strategy that wrote it.
        stall_seconds: how long ``save`` blocked training.
        persist_seconds: from the start of ``save`` until the checkpoint was committed (None while in flight).
        url: the committed folder (None while in flight).
        bytes: total size of the committed files (None while in flight).
        skipped: True when the step was already committed and nothing was written.
    """

    step: int
    strategy: str
    stall_seconds: float
    persist_seconds: float | None = None
    url: str | None = None
    bytes: int | None = None
    skipped: bool = False


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
        self._last_step: int | None = None  # the newest step given to maybe_save/save, for close()'s check
        self._inflight: Future[SaveResult] | None = None
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="goodput-ckpt")
        self._purger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="goodput-purge")
        self._purge: Future[None] | None = None
        self._closed = False
        self.results: list[SaveResult] = []
        self._restore_parts: dict[str, float] = {}
        if self.rank == 0:
            self._layout.clean_partials(stale_after=config.seconds("partial_grace"))
        self.memory: MemoryCheckpointer | None = None
        self._memory_group: Any = None
        self._memory_policy: SavePolicy | None = None
        self._memory_due = False
        self._memory_schedule: StepSchedule | None = None
        if config.memory is not None:
            self.memory, self._memory_policy = open_memory_tier(self, ranks)
            if self._dist and isinstance(self._memory_policy, EveryInterval):
                self._memory_schedule = StepSchedule(self._memory_policy)
        self._barrier()

    # ---- plumbing -------------------------------------------------------------------------------------------
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
        way by a schedule of its own, and also saves whenever the durable tier does.
        """
        now = self._clock() if now is None else now
        due = self._decide(self._policy, self._schedule, step, now)
        if self._memory_policy is not None:
            memory = self._decide(self._memory_policy, self._memory_schedule, step, now)
            self._memory_due = memory or due
        return due

    def _decide(self, policy: SavePolicy, schedule: StepSchedule | None, step: int, now: float) -> bool:
        if schedule is None:
            return bool(policy.due(step, now))
        if schedule.pending(step):
            return False
        decision = schedule.decide(step, now) if self.rank == 0 else None
        due, next_decision = self._bcast(decision)
        schedule.agreed(next_decision)
        return bool(due)

    def should_save_memory(self, step: int) -> bool:
        """Whether the memory tier saves ``step`` (decided by the last ``should_save`` call, for that step)."""
        return self.memory is not None and self._memory_due and step not in self.memory.committed[:1]

    def save_memory(self, step: int) -> float:
        """Save ``step`` to the memory tier (blocks only for the staging copy); returns the blocked seconds."""
        self._check_open()
        assert self.memory is not None and self._memory_policy is not None, "no memory tier configured"
        self._memory_policy.saved(step, self._clock())
        return self.memory.save(step)

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

    def _alone(self, step: int, err: Exception, seconds: float) -> CheckpointError:
        """This rank failed alone in a save: its peers may wait in a collective it never joins (DCP's
        planning). No step brings them back in line, so the error ends the attempt; torchrun stops the peers
        at once and restarts the job (no wait for the hang watchdog). The previous checkpoint is untouched."""
        error = f"rank {self.rank}: {_describe(err)}"
        self._emit("checkpoint_failed", step=step, error=error)
        self._emit("checkpoint_stall", phase="end", step=step, seconds=seconds)
        return CheckpointError(
            f"saving step {step} failed on {error} before the other ranks' collectives could finish; "
            "ending this attempt so that the job restarts (the previous checkpoint is untouched)"
        )

    def _begin(self, step: int, group: Any) -> tuple[str, str, bool]:
        """Rank 0 creates the step folder with its lease (or finds the step committed); every rank learns
        (folder, error, already committed)."""
        begun: tuple[str, str, bool] = ("", "", False)
        if self.rank == 0:
            try:
                if self._layout.is_committed(step):
                    begun = (self._layout.final_dir(step), "", True)
                else:
                    begun = (self._layout.begin(step, self._token), "", False)
            except Exception as err:  # every rank waits for rank 0's word: always send one
                begun = ("", f"creating the step folder: {type(err).__name__}: {err}", False)
        folder, error, exists = self._bcast(begun, group)
        return folder, error, exists

    def _save_staged(self, step: int, start: float) -> SaveResult:
        """An asynchronous save whose strategy only stages now and writes when its completion runs: the step
        folder, its lease and the already-committed check run in the background, before the write."""
        folder = self._layout.folder_for(step, self._token)
        completion: Completion
        try:
            completion = self._strategy.save(self.state, folder, self._ctx)
        except _FAILURES as err:
            completion = _raiser(err)
        fault_point("checkpoint_write", step)  # staged, not written
        stall = self._clock() - start
        self._emit("checkpoint_stall", phase="end", step=step, seconds=stall)
        self._inflight = self._finisher.submit(self._begin_and_finish, step, completion, start, stall)
        return SaveResult(step, self.config.strategy, stall)

    def _begin_and_finish(self, step: int, completion: Completion, start: float, stall: float) -> SaveResult:
        folder, error, exists = self._begin(step, self._io)
        if exists:  # committed by an earlier run that this manager did not restore: never overwrite it
            self._committed.add(step)
            return SaveResult(step, self.config.strategy, stall, 0.0, folder, None, skipped=True)
        return self._finish(step, folder, _raiser(OSError(error)) if error else completion, start, stall)

    def _finish(
        self, step: int, folder: str, completion: Completion, start: float, stall: float | None
    ) -> SaveResult:
        """Wait for this rank's files, gather every rank's, commit on rank 0, agree on the outcome.

        ``stall`` is the blocking time of an asynchronous save; None for a synchronous one (all of it blocked).
        """
        mine: tuple[str, Any]
        try:
            names = completion()
            if stall is not None:
                fault_point("async_upload", step)  # uploaded in the background, not committed
            # names map to the checksums computed while writing (no read-back); others are read back
            mine = ("ok", self._layout.rank_files(folder, names, checksum=self._algorithm or False))
        except _FAILURES as err:
            mine = ("error", f"rank {self.rank}: {_describe(err)}")
        parts = self._gather(mine)
        outcome: tuple[str, Any] = ("error", "")
        if self.rank == 0:
            try:
                outcome = self._commit(step, folder, parts)
            except Exception as err:  # every rank waits for rank 0's word: always send one
                outcome = ("error", f"commit: {type(err).__name__}: {err}")
        outcome = self._bcast(outcome, self._io)
        persist = self._clock() - start
        if stall is None:  # a synchronous save blocked training until now
            stall = persist
            self._emit("checkpoint_stall", phase="end", step=step, seconds=stall)
        if outcome[0] != "ok":
            self._emit("checkpoint_failed", step=step, error=outcome[1])
            raise SaveFailed(
                f"saving step {step} failed ({outcome[1]}); the previous checkpoint is untouched"
            )
        url, size = outcome[1]
        self._committed.add(step)
        self._policy.measured(stall, persist)
        result = SaveResult(step, self.config.strategy, stall, persist, url, size)
        self.results.append(result)
        self._emit(
            "checkpoint_durable", step=step, stall_seconds=stall, persist_seconds=persist, bytes=size, url=url
        )
        if self.rank == 0:
            self._schedule_purge()
        return result

    def _gather(self, mine: tuple[str, Any]) -> list[tuple[str, Any]]:
        if not self._dist:
            return [mine]
        box: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        assert self._io is not None
        dist.gather_object(mine, box, dst=dist.get_global_rank(self._io, 0), group=self._io)
        return list(box or [])

    def _commit(self, step: int, folder: str, parts: list[tuple[str, Any]]) -> tuple[str, Any]:
        errors = [str(detail) for status, detail in parts if status != "ok"]
        if not errors:
            files: dict[str, FileEntry] = {}
            for _status, entries in parts:
                files.update(entries)
            manifest = Manifest(
                step=step,
                strategy=self.config.strategy,
                world_size=self.world_size,
                wall_time=time.time(),
                files=files,
                goodput_version=goodput.__version__,
            )
            try:
                return ("ok", (self._layout.commit(folder, manifest), manifest.total_bytes))
            except OSError as err:
                errors.append(f"commit: {type(err).__name__}: {err}")
        if folder:
            self._layout.abort(folder)
        return ("error", "; ".join(errors) + self._space_hint())

    def _space_hint(self) -> str:
        """Name a full disk when that is the likely cause (torch's writers hide ENOSPC behind 'unexpected pos')."""
        free = self._layout.free_bytes()
        needed = self.results[-1].bytes if self.results and self.results[-1].bytes else 1 << 20
        if free is None or free >= needed:
            return ""
        return f"; No space left on device? {self._layout.root} has {free} bytes free, the last checkpoint took {needed}"

    def _wait_inflight(self) -> SaveResult | SaveFailed | None:
        if self._inflight is None:
            return None
        future, self._inflight = self._inflight, None
        try:
            return future.result()
        except SaveFailed as err:
            log.warning("%s", err)
            return err

    def wait(self) -> SaveResult | None:
        """Block until the save in flight (if any) is durable; returns its result.

        Raises:
            SaveFailed: when that save failed.
        """
        outcome = self._wait_inflight()
        if isinstance(outcome, SaveFailed):
            raise outcome
        return outcome

    # ---- retention ------------------------------------------------------------------------------------------
    def _schedule_purge(self) -> None:
        if self._purge is not None and not self._purge.done():
            return  # the running purge will see this commit next time
        self._purge = self._purger.submit(self._run_purge)

    def _run_purge(self) -> None:
        try:
            for info in self.to_purge(self._layout.scan()):
                fault_point("checkpoint_purge", max(self._committed, default=info.step))
                self._layout.remove(info)
        except Exception:
            log.exception("purging old checkpoints under %s failed; they stay", self._layout.root)

    def to_purge(self, rows: list[CheckpointInfo]) -> list[CheckpointInfo]:
        """Which committed checkpoints retention removes: all but the newest ``keep_last`` and the
        ``keep_every`` multiples. The newest committed one is never among them."""
        committed = sorted((r for r in rows if r.status == "committed"), key=lambda r: r.step, reverse=True)
        keep_every = self.config.keep_every
        return [
            r
            for i, r in enumerate(committed)
            if i >= self.config.keep_last and not (keep_every and r.step % keep_every == 0)
        ]

    # ---- restoring -----------------------------------------------------------------------------------------
    def restore_latest(self) -> int | None:
        """Load the newest valid checkpoint into the state; returns its step, or None when there is none.

        A checkpoint that fails verification or loading is skipped with a warning naming the file, and the
        next older one is tried.

        Raises:
            StateMismatch: the newest valid checkpoint does not fit the model/optimizer (names key and shapes).
        """
        self._check_open()
        _quiet_single_process()
        self.wait()
        started = self._clock()
        listing: tuple[list[tuple[int, str]], str] = ([], "")
        if self.rank == 0:
            try:
                rows = self._layout.scan()
                listing = ([(r.step, r.url) for r in rows if r.status == "committed"], "")
            except Exception as err:  # every rank waits for rank 0's word: always send one
                listing = ([], f"{type(err).__name__}: {err}")
            for row in rows if not listing[1] else []:
                if row.status == "corrupt":
                    log.warning("skipping checkpoint step %d: %s", row.step, row.reason)
        candidates, error = self._bcast(listing)
        if error:
            raise StorageError(f"cannot list the checkpoints under {self._layout.root}: {error}")
        self._committed = {step for step, _ in candidates}
        self._restore_parts = {"find": self._clock() - started}
        start = self._clock()
        if self.memory is not None:  # memory first, unless the durable tier holds a newer step
            found = self.memory.restore(at_least=candidates[0][0] if candidates else None)
            if found is not None:
                return self._restored(found.step, start, tier=found.tier, source=found.source)
        for step, url in candidates:
            if self._try_load(step, url):
                self._emit(
                    "restore_parts", step=step, **{f"{k}_seconds": v for k, v in self._restore_parts.items()}
                )
                fault_point("restore", step)  # loaded, not yet in use
                self._last_step = step
                return self._restored(step, start, tier="durable", source="durable")
        return None

    def _restored(self, step: int, start: float, *, tier: str, source: str) -> int:
        self.state.step = step
        self._policy.saved(step, self._clock())
        if self._memory_policy is not None:
            self._memory_policy.saved(step, self._clock())
        for schedule in (self._schedule, self._memory_schedule):
            if schedule is not None:
                schedule.reset()
        self._emit("checkpoint_restored", step=step, tier=tier, source=source, seconds=self._clock() - start)
        return step

    def _try_load(self, step: int, url: str) -> bool:
        verdict: tuple[str, Any] = ("ok", None)
        started = self._clock()
        if self.rank == 0:
            try:
                verdict = ("ok", self._verify(url))
            except CheckpointCorrupt as err:
                verdict = ("corrupt", str(err))
            except Exception as err:  # storage trouble, not a bad checkpoint: stop rather than fall back
                verdict = ("unreachable", f"{type(err).__name__}: {err}")
        verdict = self._bcast(verdict)
        if verdict[0] == "unreachable":
            raise StorageError(f"cannot verify {url}: {verdict[1]}")
        if verdict[0] != "ok":
            log.warning("skipping checkpoint step %d: %s", step, verdict[1])
            return False
        manifest: Manifest = verdict[1]
        if manifest.world_size != self.world_size:  # resharded by the strategy; see TrainingState
            log.info(
                "restoring step %d saved by %d ranks onto %d", step, manifest.world_size, self.world_size
            )
        mine: tuple[str, str] = ("ok", "")
        verified = self._clock()
        strategy = make_strategy(manifest.strategy, self._ctx)
        # strategies that verify while reading get the manifest's entries (one pass over the bytes)
        self._ctx.options["expected"] = manifest.files if self._checksums else None
        try:
            strategy.load(self.state, url, self._ctx)
        except StateMismatch as err:
            mine = ("mismatch", str(err))
        except _FAILURES as err:
            mine = ("error", f"rank {self.rank}: {_describe(err)}")
        finally:
            self._ctx.options.pop("expected", None)
        parts: dict[str, float] = dict(getattr(strategy, "last_load_seconds", None) or {})
        if not parts:
            parts = {"load": self._clock() - verified}
        self._restore_parts = {
            "find": self._restore_parts.get("find", 0.0),
            "verify": verified - started,
            **parts,
        }
        outcomes = self._all_gather(mine)  # every rank learns every rank's outcome: no rank is left waiting
        mismatches = [detail for status, detail in outcomes if status == "mismatch"]
        if mismatches:
            raise StateMismatch(f"{url}: {mismatches[0]}")
        failures = [detail for status, detail in outcomes if status != "ok"]
        if failures:
            log.warning(
                "skipping checkpoint step %d (%s): loading failed: %s", step, url, "; ".join(failures)
            )
            return False
        log.info("restored step %d from %s", step, url)
        return True

    def _verify(self, url: str) -> Manifest:
        """Rank 0's check before loading: sizes always; checksums here only for strategies that do not check
        them while reading (DCP's strategies verify each file as they read it)."""
        manifest = self._layout.verify(url, checksums=False)
        if self._checksums and not getattr(_strategy_class(manifest.strategy), "verifies_on_read", False):
            manifest = self._layout.verify(url, checksums=True)
        return manifest

    def _all_gather(self, mine: Any) -> list[Any]:
        if not self._dist:
            return [mine]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, mine, group=self._ctl)
        return out

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
            for group in (self._ctl, self._io, self._memory_group):
                if group is not None:
                    dist.destroy_process_group(group)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(finished=exc[0] is None)  # no final save: after an exception the state may be mid-step


def _strategy_class(name: str) -> type | None:
    if name == "torch_save":
        from goodput.checkpoint.torch_save import TorchSaveStrategy

        return TorchSaveStrategy
    if name in ("dcp", "dcp_async"):
        from goodput.checkpoint.dcp import DcpStrategy

        return DcpStrategy
    return None


def _raiser(err: BaseException) -> Completion:
    def complete() -> list[str]:
        raise err

    return complete


def _describe(err: BaseException) -> str:
    """One line for an error; DCP's CheckpointException carries each rank's real error inside."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        return "; ".join(f"{type(e).__name__}: {e}" for e in inner)
    return f"{type(err).__name__}: {err}"
