"""The save path of ``CheckpointManager``: the step folder, the background finishing of a save (gather every
rank's files, commit on rank 0, agree on the outcome) and the wait for a save in flight.

A mixin of ``CheckpointManager`` (see ``manager.py``), kept apart so each file holds one part of the manager.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException

import goodput
from goodput.checkpoint.config import CheckpointConfig
from goodput.checkpoint.layout import CheckpointLayout
from goodput.checkpoint.manifest import FileEntry, Manifest
from goodput.checkpoint.policy import SavePolicy
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.strategy import Completion, SaveContext
from goodput.errors import CheckpointError, SaveFailed
from goodput.faults import fault_point

if TYPE_CHECKING:
    from goodput.checkpoint.memory.checkpointer import MemoryCheckpointer

__all__ = ["SaveResult"]

log = logging.getLogger("goodput.checkpoint.manager")  # the manager's logger, as before the split

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


class _SavePath:
    """``CheckpointManager``'s save path (see the class; the attributes below are set by its ``__init__``)."""

    config: CheckpointConfig
    state: TrainingState
    rank: int
    world_size: int
    results: list[SaveResult]
    _clock: Callable[[], float]
    _layout: CheckpointLayout
    _dist: bool
    _io: Any
    _ctx: SaveContext
    _strategy: Any
    _policy: SavePolicy
    _token: str
    _committed: set[int]
    _failed: set[int]
    _inflight: Future[SaveResult] | None
    _finisher: ThreadPoolExecutor
    _algorithm: str | None
    memory: MemoryCheckpointer | None
    _forced_stall: tuple[int, float] | None

    if TYPE_CHECKING:  # provided by CheckpointManager / the other parts

        def _emit(self, name: str, **fields: Any) -> None: ...
        def _bcast(self, value: Any, group: Any = None) -> Any: ...
        def _schedule_purge(self) -> None: ...

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
                # a committed step that failed to restore (a fresh start was allowed) is saved over
                if step not in self._failed and self._layout.is_committed(step):
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
        # The memory tier staged this very step a moment ago: write from its copy instead of copying again.
        staged = self.memory.staged_state(step) if self.memory is not None else None
        completion: Completion
        try:
            if staged is not None and hasattr(self._strategy, "save_staged"):
                completion = self._strategy.save_staged(staged, folder, self._ctx)
            else:
                staged = None
                completion = self._strategy.save(self.state, folder, self._ctx)
        except _FAILURES as err:
            completion = _raiser(err)
        fault_point("checkpoint_write", step)  # staged, not written
        stall = self._clock() - start
        self._emit("checkpoint_stall", phase="end", step=step, seconds=stall)
        self._inflight = self._finisher.submit(self._begin_and_finish, step, completion, start, stall)
        if staged is not None and self.memory is not None:
            self.memory.hold(self._inflight)
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
            failed = SaveFailed(
                f"saving step {step} failed ({outcome[1]}); the previous checkpoint is untouched"
            )
            log.warning("%s", failed)  # once, here, whoever catches it (``Run`` trains on)
            raise failed
        url, size = outcome[1]
        self._committed.add(step)
        forced = (
            self._forced_stall
        )  # a memory save made only for this one: part of its cost (see should_save)
        self._policy.measured(
            stall + (forced[1] if forced is not None and forced[0] == step else 0.0), persist
        )
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
        except SaveFailed as err:  # logged where it failed
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
