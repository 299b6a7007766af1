"""The durable tier: a save strategy writing step folders under the checkpoint root, committed atomically by rank
0, kept by retention, and restored newest valid first.

A save has two halves: the blocking part (the strategy's write, or only its staging for ``dcp_async``) on the
training thread, and the finishing (gather every rank's files, commit on rank 0, agree on the outcome) on a
background thread of its own, so at most one save is in flight. The parts live in their own modules: the
layout (``layout.py``), the strategies (``strategy.py``), retention (``_retention.py``) and the restore path
(``_restoring.py``); this class composes them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any, Protocol

import torch.distributed
from torch.distributed.checkpoint import CheckpointException

import goodput
from goodput._storage_errors import is_refusal, refusals_named
from goodput.checkpoint._collectives import Collectives
from goodput.checkpoint._contention import BackgroundCpu
from goodput.checkpoint._saving import FAILURES, SaveResult, describe, raiser
from goodput.checkpoint.config import CheckpointConfig
from goodput.checkpoint.durable._finisher import Finisher
from goodput.checkpoint.durable._restoring import DurableReader
from goodput.checkpoint.durable._retention import Retention, to_purge
from goodput.checkpoint.durable.layout import CheckpointLayout
from goodput.checkpoint.durable.manifest import CheckpointInfo, FileEntry, Manifest
from goodput.checkpoint.durable.strategy import Completion, SaveContext, make_strategy
from goodput.checkpoint.policy import SavePolicy
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.tier import Cadence, Damage, Restored
from goodput.errors import CheckpointError, SaveFailed
from goodput.faults import fault_point

__all__ = ["DurableCheckpointer", "StagedSource"]

ABANDON_POLL_SECONDS = 0.05  # how often a wait for the save in flight asks ``Collectives.over``

log = logging.getLogger("goodput.checkpoint.manager")  # the manager's logger: one name for its messages

Emit = Callable[..., None]


class StagedSource(Protocol):
    """A faster tier that may already hold a step staged in memory (the memory tier): the durable save then
    writes from that copy instead of copying the state again, and holds the copy until its write is done."""

    def staged_state(self, step: int) -> dict[str, Any] | None: ...

    def hold(self, future: Future[Any]) -> None: ...


class DurableCheckpointer:
    """The durable tier (a ``RecordTier``): step folders under ``config.root``, written by ``config.strategy``.

    Args:
        config: the root, strategy, checksums and retention.
        state: the training state.
        layout: the root's folders and manifests.
        coll: the manager's groups.
        policy: the durable save policy (told what each save cost); a time-based save due while the previous
            one is in flight waits for the step after it (see ``CheckpointManager``).
        token: this job's token (the lease of its step folders).
        emit: the manager's event hook.
        clock: monotonic seconds.
    """

    name = "durable"

    def __init__(
        self,
        config: CheckpointConfig,
        state: TrainingState,
        layout: CheckpointLayout,
        coll: Collectives,
        *,
        policy: SavePolicy,
        token: str,
        emit: Emit,
        clock: Callable[[], float],
    ) -> None:
        self.config, self.state, self.layout, self.coll = config, state, layout, coll
        self.policy, self.token, self._emit, self._clock = policy, token, emit, clock
        self.cadence = Cadence(policy, defers=True)
        self._algorithm = config.checksum_algorithm(layout.local)
        self.ctx = SaveContext(
            layout,
            coll.rank,
            coll.world_size,
            coll.io,
            {"async_checkpointer": config.async_checkpointer, "checksum": self._algorithm},
        )
        self.strategy = make_strategy(config.strategy, self.ctx)
        self.reader = DurableReader(config, state, layout, coll, self.ctx, clock)
        self.retention = Retention(config, layout, lambda step: max(self.committed, default=step))
        self.staged: StagedSource | None = None  # set when a memory tier stages saves (``_tiers.py``)
        self.committed: list[int] = []  # newest first
        self.failed: set[int] = set()  # steps whose committed checkpoint failed to restore (saved over)
        self.skipped: list[tuple[int, str]] = []  # (step, why) of those the last restore passed over
        self.candidates: list[tuple[int, str]] = []  # (step, url) the last ``find`` listed, newest first
        self.results: list[SaveResult] = []
        self._charged: tuple[int, float] | None = None  # (step, seconds) another tier spent for this save
        self._inflight: Future[SaveResult] | None = None
        self._waited = 0.0  # how long the save being made waited for the one in flight (part of its stall)
        self._finisher = Finisher("goodput-ckpt")

    @property
    def root(self) -> str:
        """The checkpoint root, as the layout spells it."""
        return self.layout.root

    def prepare(self) -> None:
        """Rank 0, before any training: remove crashed saves' folders and, under a remote root, write and remove
        a probe object. Credentials the store refuses (none, wrong ones, read-only) stop the job here with one
        line (``AccessRefused``, fatal: no restarted attempt can fix them), not at every attempt or first save.
        A remote store that refuses the probe for another reason (full, throttling past its retries) is one
        warning: the attempt restores and trains, and its saves fail or commit as the store allows, as when it
        fills up mid-run; failing here would make every restart while it lasts a crash of its own."""
        config, layout = self.config, self.layout
        with refusals_named(config.root, config.storage_options, verb="write checkpoints to"):
            layout.clean_partials(stale_after=config.seconds("partial_grace"))
            if not layout.local:
                probe = layout.join(f".goodput-probe-{self.token}")
                try:
                    layout.fs.pipe_file(probe, b"")
                    layout.fs.rm_file(probe)
                except OSError as err:
                    if is_refusal(err):
                        raise
                    log.warning(
                        "the checkpoint store refused a probe write, training goes on: %s", describe(err)
                    )

    def _add(self, step: int) -> None:
        self.committed = sorted({*self.committed, step}, reverse=True)

    # ---- saving ---------------------------------------------------------------------------------------------
    def charge(self, step: int, seconds: float) -> None:
        """Count ``seconds`` of another tier's stall as part of saving ``step`` (the policy's cost of a save)."""
        self._charged = (step, seconds)

    def save(self, step: int) -> SaveResult:
        """Save the state as ``step`` (see ``CheckpointManager.save``) once the save in flight is settled.

        Training is blocked from the call on, so the wait for the save in flight is part of this save's
        ``checkpoint_stall`` span. That save's failure does not stop this one: it is raised once this save is
        made (or, when asynchronous, in flight), so a failure never costs the next checkpoint too.
        """
        self._emit("checkpoint_stall", phase="start", step=step)
        called, busy = self._clock(), self._inflight is not None
        previous = self.settle()
        self._waited = self._clock() - called if busy else 0.0
        result = self._save(step)
        if isinstance(previous, SaveFailed):
            raise previous  # logged where it failed; reported to the caller once, here
        return result

    def _stall_end(self, step: int, stall: float) -> None:
        """Training goes on: the end of this save's ``checkpoint_stall``, its ``stall`` after the wait for the
        save in flight (the event's seconds count both, as its span does)."""
        self._emit(
            "checkpoint_stall", phase="end", step=step, seconds=self._waited + stall, waited=self._waited
        )

    def _save(self, step: int) -> SaveResult:
        if step in self.committed:
            self._stall_end(step, 0.0)
            return SaveResult(
                step, self.config.strategy, 0.0, 0.0, self.layout.final_dir(step), None, skipped=True
            )
        now = self._clock()
        self.policy.saved(step, now)
        start = self._clock()
        self.state.step = step
        if getattr(self.strategy, "writes_later", False):
            return self._save_staged(step, start)
        folder, error, exists = self._begin(step, self.coll.ctl)
        if exists:  # committed by an earlier run that this manager did not restore: never overwrite it
            self._add(step)
            self._stall_end(step, self._clock() - start)
            return SaveResult(
                step, self.config.strategy, self._clock() - start, 0.0, folder, None, skipped=True
            )
        completion: Completion
        if error:
            completion = raiser(OSError(error))
        else:
            try:
                fault_point("checkpoint_begin", step)  # this rank enters the save; its peers may be inside
                completion = self.strategy.save(self.state, folder, self.ctx)
            except CheckpointException as err:  # DCP raises its failures on every rank alike
                completion = raiser(err)
            except Exception as err:
                if self.coll.world_size > 1:
                    raise self._alone(step, err, self._clock() - start) from err
                completion = raiser(err)
        fault_point("checkpoint_write", step)  # written (or staged), not committed
        if self.strategy.is_async:
            stall = self._clock() - start
            self._stall_end(step, stall)
            self._inflight = self._finisher.submit(self._finish, step, folder, completion, start, stall)
            return SaveResult(step, self.config.strategy, stall)
        return self._finish(step, folder, completion, start, None)

    def _alone(self, step: int, err: Exception, stall: float) -> CheckpointError:
        """This rank failed alone in a save: its peers may wait in a collective it never joins (DCP's
        planning). No step brings them back in line, so the error ends the attempt; torchrun stops the peers
        at once and restarts the job (no wait for the hang watchdog). The previous checkpoint is untouched."""
        error = f"rank {self.coll.rank}: {describe(err)}"
        self._emit("checkpoint_failed", step=step, error=error)
        self._stall_end(step, stall)
        return CheckpointError(
            f"saving step {step} failed on {error} before the other ranks' collectives could finish; "
            "ending this attempt so that the job restarts (the previous checkpoint is untouched)"
        )

    def _begin(self, step: int, group: Any) -> tuple[str, str, bool]:
        """Rank 0 creates the step folder with its lease (or finds the step committed); every rank learns
        (folder, error, already committed)."""

        def begin() -> tuple[str, str, bool]:
            # a committed step that failed to restore (a fresh start was allowed) is saved over
            if step not in self.failed and self.layout.is_committed(step):
                return self.layout.final_dir(step), "", True
            return self.layout.begin(step, self.token), "", False

        def failed(err: Exception) -> tuple[str, str, bool]:
            return "", f"creating the step folder: {type(err).__name__}: {err}", False

        return self.coll.rank0_decides(begin, failed, group)

    def _save_staged(self, step: int, start: float) -> SaveResult:
        """An asynchronous save whose strategy only stages now and writes when its completion runs: the step
        folder, its lease and the already-committed check run in the background, before the write."""
        folder = self.layout.folder_for(step, self.token)
        # The memory tier staged this very step a moment ago: write from its copy instead of copying again.
        staged = self.staged.staged_state(step) if self.staged is not None else None
        completion: Completion
        try:
            if staged is not None and hasattr(self.strategy, "save_staged"):
                completion = self.strategy.save_staged(staged, folder, self.ctx)
            else:
                staged = None
                completion = self.strategy.save(self.state, folder, self.ctx)
        except FAILURES as err:
            completion = raiser(err)
        fault_point("checkpoint_write", step)  # staged, not written
        stall = self._clock() - start
        self._stall_end(step, stall)
        self._inflight = self._finisher.submit(self._begin_and_finish, step, completion, start, stall)
        if staged is not None and self.staged is not None:
            self.staged.hold(self._inflight)
        return SaveResult(step, self.config.strategy, stall)

    def _begin_and_finish(self, step: int, completion: Completion, start: float, stall: float) -> SaveResult:
        folder, error, exists = self._begin(step, self.coll.io)
        if exists:  # committed by an earlier run that this manager did not restore: never overwrite it
            self._add(step)
            return SaveResult(step, self.config.strategy, stall, 0.0, folder, None, skipped=True)
        return self._finish(step, folder, raiser(OSError(error)) if error else completion, start, stall)

    def _finish(
        self, step: int, folder: str, completion: Completion, start: float, stall: float | None
    ) -> SaveResult:
        """Wait for this rank's files, gather every rank's, commit on rank 0, agree on the outcome.

        ``stall`` is the blocking time of an asynchronous save; None for a synchronous one (all of it blocked).
        """
        cpu = BackgroundCpu()  # an asynchronous save's background half, on the finisher thread
        mine: tuple[str, Any]
        try:
            self.coll.ensure_open()  # DCP's collectives run on the groups too
            names = completion()
            if stall is not None:
                fault_point("async_upload", step)  # uploaded in the background, not committed
            # names map to the checksums computed while writing (no read-back); others are read back
            mine = ("ok", self.layout.rank_files(folder, names, checksum=self._algorithm or False))
        except FAILURES as err:
            mine = ("error", f"rank {self.coll.rank}: {describe(err)}")
        parts = self.coll.gather_io(mine)
        outcome: tuple[str, Any] = self.coll.rank0_decides(
            lambda: self._commit(step, folder, parts),
            lambda err: ("error", f"commit: {type(err).__name__}: {err}"),
            self.coll.io,
        )
        persist = self._clock() - start
        if stall is None:  # a synchronous save blocked training until now
            stall = persist
            self._stall_end(step, stall)
        if outcome[0] != "ok":
            self._emit("checkpoint_failed", step=step, error=outcome[1])
            failed = SaveFailed(
                f"saving step {step} failed ({outcome[1]}); the previous checkpoint is untouched",
                step=step,
                reason=outcome[1],
            )
            log.warning("%s", failed)  # once, here, whoever catches it (``Run`` trains on)
            raise failed
        url, size = outcome[1]
        self._add(step)
        charged = self._charged  # a memory save made only for this one: part of its cost (see should_save)
        cost = stall + (charged[1] if charged is not None and charged[0] == step else 0.0)
        # the write's CPU time, where it is taken from training (see checkpoint/_contention.py)
        self.policy.measured(cost + (cpu.charged() if persist > stall else 0.0), persist)
        result = SaveResult(step, self.config.strategy, stall, persist, url, size)
        self.results.append(result)
        self._emit(
            "checkpoint_durable", step=step, stall_seconds=stall, persist_seconds=persist, bytes=size, url=url
        )
        if self.coll.rank == 0:
            self.retention.schedule()
        return result

    def _commit(self, step: int, folder: str, parts: list[tuple[str, Any]]) -> tuple[str, Any]:
        errors = [str(detail) for status, detail in parts if status != "ok"]
        if not errors:
            files: dict[str, FileEntry] = {}
            for _status, entries in parts:
                files.update(entries)
            manifest = Manifest(
                step=step,
                strategy=self.config.strategy,
                world_size=self.coll.world_size,
                wall_time=time.time(),
                files=files,
                goodput_version=goodput.__version__,
            )
            try:
                return ("ok", (self.layout.commit(folder, manifest), manifest.total_bytes))
            except OSError as err:
                errors.append(f"commit: {type(err).__name__}: {err}")
        if folder:
            self.layout.abort(folder)
        return ("error", "; ".join(errors) + self._space_hint())

    def _space_hint(self) -> str:
        """Name a full disk when that is the likely cause (torch's writers hide ENOSPC behind 'unexpected pos')."""
        free = self.layout.free_bytes()
        needed = self.results[-1].bytes if self.results and self.results[-1].bytes else 1 << 20
        if free is None or free >= needed:
            return ""
        return f"; No space left on device? {self.layout.root} has {free} bytes free, the last checkpoint took {needed}"

    def busy(self) -> bool:
        """Whether a save is in flight and not finished yet."""
        return self._inflight is not None and not self._inflight.done()

    def settle(self) -> SaveResult | SaveFailed | None:
        """Wait for the save in flight: its result, its failure (returned, not raised) or None.

        Raises:
            DistError: the group's generation ended first (``Collectives.over``): the save is left unfinished (its
                collectives may not return before the group's timeout; a rank leaves an ended generation now).
        """
        if self._inflight is None:
            return None
        future, self._inflight = self._inflight, None
        ended = self.coll.over
        while ended is not None and not wait([future], timeout=ABANDON_POLL_SECONDS).done:
            if ended():
                raise torch.distributed.DistError(
                    "goodput: the process group's generation ended with a checkpoint save in flight; it is left "
                    "unfinished (never committed)"
                )
        try:
            return future.result()
        except SaveFailed as err:  # logged where it failed
            return err

    def wait(self) -> SaveResult | None:
        """Block until the save in flight (if any) is durable; returns its result.

        Raises:
            SaveFailed: when that save failed.
        """
        outcome = self.settle()
        if isinstance(outcome, SaveFailed):
            raise outcome
        return outcome

    # ---- restoring ------------------------------------------------------------------------------------------
    def find(self, *, at_most: int | None = None) -> int | None:
        """List the committed checkpoints (a rollback's ``at_most`` discards every newer one); returns the newest
        step, the floor for faster tiers (they restore only a step at least as new)."""
        started = self._clock()
        # The purge the last commit started ends first: the listing holds no folder it is removing, and a
        # rollback's discard of newer steps is then the one remover of each folder it names.
        self.retention.wait()
        candidates, skipped = self.reader.listing()
        if at_most is not None:
            self.reader.discard_newer([(step, url) for step, url in candidates if step > at_most])
            candidates = [(step, url) for step, url in candidates if step <= at_most]
            skipped = [(step, why) for step, why in skipped if step <= at_most]  # the abandoned timeline's
        self.candidates, self.skipped = candidates, skipped
        self.committed = [step for step, _ in candidates]
        self.failed = {step for step, _ in skipped}  # failed to load: saved over, not skipped (``_begin``)
        self.reader.parts = {"find": self._clock() - started}
        return candidates[0][0] if candidates else None

    def restore(self, *, at_least: int | None = None) -> Restored | None:
        """Load the newest valid checkpoint ``find`` listed (no older than ``at_least``); a damaged one is passed
        over (named in a warning) and saved over when training reaches its step again."""
        for step, url in self.candidates:
            if at_least is not None and step < at_least:
                break
            failure = self.reader.try_load(step, url)
            if failure is not None:
                self.skipped.append((step, failure))
                self.committed.remove(step)  # a damaged step is saved over when training reaches it again
                self.failed.add(step)
                continue
            self._emit(
                "restore_parts", step=step, **{f"{k}_seconds": v for k, v in self.reader.parts.items()}
            )
            fault_point("restore", step)  # loaded, not yet in use
            return Restored(step, "durable", "durable")
        return None

    def damage(self) -> Damage:
        """The checkpoints the listing found corrupt and those the last restore could not load."""
        return Damage(sorted(self.skipped, reverse=True))

    def pin(self, step: int) -> None:
        """Keep the newest checkpoint at or before ``step`` until a later pin (see ``_retention``)."""
        self.retention.pinned = step

    def to_purge(self, rows: list[CheckpointInfo]) -> list[CheckpointInfo]:
        """Which of ``rows`` retention removes (see ``_retention.to_purge``)."""
        return to_purge(self.config, rows, pinned=self.retention.pinned)

    # ---- lifetime -------------------------------------------------------------------------------------------
    def close(self, *, finished: bool = True) -> None:
        """Wait for retention and the finishing thread; release the strategy's buffers."""
        self.retention.close()
        self._finisher.shutdown(wait=True)
        self.strategy.close()

    def own_groups(self) -> list[Any]:
        """None: the tier's groups are the manager's."""
        return []

    def drop_groups(self) -> None:
        """Forget the background group (the manager releases it)."""
        self.ctx.group = None
