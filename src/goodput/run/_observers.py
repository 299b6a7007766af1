"""The hooks that watch a run from inside the worker: the watchdog's beat, the crash-loop record, the progress
line, verify-resume's step records and the data cache's counters; and ``builtin_hooks``, a new run's list.

Each adapts an object with an API of its own (``Watchdog``, ``CrashLoopDetector``, ``Progress``,
``StepRecorder``, ``CacheStatsRecorder``) to the moments of :class:`~goodput.run.hooks.RunHook`, so ``Run`` calls
them all the same way and none of them knows about the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from goodput._env import CRASH_LOOP
from goodput.faults import Fault
from goodput.job.crashloop import CrashLoopDetector, record_failure
from goodput.job.folder import listen_for_failure
from goodput.ledger.exporters import MetricsExporter
from goodput.run._cachestats import CacheStatsRecorder
from goodput.run._nodeloss import NodeLossDrill
from goodput.run._warm import WarmHook
from goodput.run.hooks import RunHook
from goodput.run.numeric import LossStop, NumericConfig, NumericGuard
from goodput.run.progress import Progress
from goodput.run.records import StepRecorder
from goodput.run.stragglers import StragglerConfig, StragglerHook, attach_stragglers
from goodput.run.watchdog import Watchdog

if TYPE_CHECKING:
    from goodput.checkpoint.state import TrainingState
    from goodput.run.run import Run
    from goodput.warm.worker import WarmWorker

__all__ = [
    "CacheStatsHook",
    "CrashLoopHook",
    "ProgressHook",
    "RecordsHook",
    "WatchdogHook",
    "builtin_hooks",
]


def builtin_hooks(
    run: Run,
    *,
    worker: WarmWorker | None,
    plan: list[Fault],
    crash_loop: int | None,
    progress: bool,
    exporters: Sequence[MetricsExporter],
    numeric: NumericConfig | None,
    hang_timeout: float | None,
    stragglers: StragglerConfig | None,
) -> list[RunHook]:
    """A new run's hooks, in the order they are called: the watchdog's first (made once no crash loop refused
    the attempt; a finished step is a heartbeat before any hook works on it), the step records next, then the
    warm hand-over (under ``--restart warm``: ``worker``), the node-loss drill, the crash-loop record, the progress line and the cache counters, the
    numeric guard (a peer's failure inside its all-gather leaves this rank where the next step's collective
    would, after every observer recorded the step) or, without it, the stop at a non-finite loss, and last the straggler detector. ``on_close`` goes in the
    reverse order."""
    # Rank 0 refuses an attempt of a crash loop before anything else starts; every rank records the error that
    # ends its attempt, for the next attempt's verdict.
    limit = crash_loop if crash_loop is not None else int(CRASH_LOOP.get())
    crash = CrashLoopHook(run.run_dir, run.attempt, limit) if run.info.rank == 0 else None
    listen_for_failure(lambda line, peer: _record_failure(run, line, peer))
    hooks: list[RunHook] = []
    # What verify-resume compares (only under GOODPUT_RECORDS): see goodput.run.records.
    recorder = StepRecorder.from_env(
        run.run_dir, rank=run.info.rank, attempt=run.attempt, world=run.info.world_size
    )
    if recorder is not None:
        hooks.append(RecordsHook(recorder))
    if worker is not None:
        hooks.append(WarmHook(worker, hang_timeout))
    if any(f.action == "nodeloss" for f in plan):
        hooks.append(NodeLossDrill())
    if crash is not None:
        hooks.append(crash)
    if progress or exporters:
        hooks.append(ProgressHook(draw=progress, exporters=exporters))
    hooks.append(CacheStatsHook())
    # The guard rolls a non-finite loss back; without it such a loss stops the run (never trained on silently).
    if numeric is not None:
        hooks.append(NumericGuard(numeric, flips=any(f.action == "bitflip" for f in plan)))
    else:
        hooks.append(LossStop())
    watchdog = WatchdogHook(run, hang_timeout) if hang_timeout else None
    if watchdog is not None:
        hooks.insert(0, watchdog)
    monitor = attach_stragglers(run, stragglers, warm=worker is not None, exporters=exporters)
    if monitor is not None:
        hooks.append(StragglerHook(monitor))
    return hooks


def _record_failure(run: Run, line: str, peer: bool) -> None:
    """Record the error that ends ``run``'s attempt on this rank, in the step under way."""
    record_failure(run.run_dir, run.attempt, rank=run.info.rank, step=run.step + 1, error=line, peer=peer)


class WatchdogHook(RunHook):
    """Each finished step is a heartbeat; a hang is recorded in the run's ledger before the watchdog ends the
    process; the run's end stops the watchdog's thread."""

    def __init__(self, run: Run, timeout: float) -> None:
        self.watchdog = Watchdog(timeout, on_hang=lambda silent, phase: self._hung(run, silent, phase))

    def _hung(self, run: Run, silent: float, phase: str | None) -> None:
        run.ledger.failure_detected("hang" + (f" in {phase}" if phase else ""), silent_seconds=silent)
        run.ledger.close("failed")

    def on_step(self, run: Run, step: int, loss: float | None) -> bool:
        self.watchdog.beat()
        return False

    def on_close(self, run: Run, status: str) -> None:
        self.watchdog.close()

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A stretch the watchdog allows longer than a step (see ``Run.phase``)."""
        return self.watchdog.phase(name)


class CrashLoopHook(RunHook):
    """Rank 0's record of each attempt's progress; refuses an attempt of a crash loop when it opens."""

    def __init__(self, run_dir: str, attempt: int, limit: int) -> None:
        self.detector = CrashLoopDetector(run_dir, attempt, limit=limit)
        self.detector.check()

    def on_restore(self, run: Run, state: TrainingState, step: int | None) -> None:
        self.detector.start(step)

    def on_step(self, run: Run, step: int, loss: float | None) -> bool:
        self.detector.progress(step)
        return False

    def on_attempt(self, run: Run, kind: str) -> None:
        # Every attempt number gets its record: a later attempt reads a missing one as an attempt that died
        # before restoring. A warm generation is an attempt of the crash-loop count, as a process start is; a
        # rollback in place is bounded by the numeric guard's own ladder, so it is recorded but not checked.
        self.detector.close()
        self.detector = CrashLoopDetector(run.run_dir, run.attempt, limit=self.detector.limit)
        if kind == "warm":
            self.detector.check()

    def on_fail(self, run: Run) -> None:
        self.detector.close()

    def on_finish(self, run: Run) -> None:
        self.detector.close()


class ProgressHook(RunHook):
    """The progress line on rank 0 and the exporters' live figures, from each restore to the run's end."""

    def __init__(self, *, draw: bool, exporters: Sequence[MetricsExporter]) -> None:
        self._draw = draw
        self._exporters = list(exporters)
        self.progress: Progress | None = None

    def on_restore(self, run: Run, state: TrainingState, step: int | None) -> None:
        self.progress = Progress(
            total=run.total_steps,
            ledger=run.ledger,
            initial=run.step,
            disable=None if self._draw else True,
            exporters=self._exporters,
        )

    def on_step(self, run: Run, step: int, loss: float | None) -> bool:
        if self.progress is not None:
            self.progress.update(step, loss=loss, fetch_seconds=run.fetch_seconds)
        return False

    def on_attempt(self, run: Run, kind: str) -> None:
        if kind == "warm":  # the next restore draws a new line for the new generation, to the same exporters
            self._close_line()
        elif self.progress is not None:  # a rollback: the same line, the new attempt's figures
            self.progress.follow(run.ledger)

    def on_close(self, run: Run, status: str) -> None:
        self._close_line()
        for exporter in self._exporters:  # theirs for the whole run: closed at its end, not a generation's
            exporter.close()

    def _close_line(self) -> None:
        if self.progress is not None:
            self.progress.close(exporters=False)
            self.progress = None


class RecordsHook(RunHook):
    """Verify-resume's record of each step (only under ``$GOODPUT_RECORDS``; see ``goodput.run.records``)."""

    def __init__(self, recorder: StepRecorder) -> None:
        self.recorder = recorder

    def on_batch(self, run: Run, step: int) -> None:
        self.recorder.batch(step, loaders=self._loaders(run))

    def on_step(self, run: Run, step: int, loss: float | None) -> bool:
        self.recorder.step(step, loaders=self._loaders(run), loss=loss)
        return False

    @staticmethod
    def _loaders(run: Run) -> tuple[Any, Any]:
        state = run.state
        return run.loader, state.loader if state else None

    def on_attempt(self, run: Run, kind: str) -> None:
        # The steps redone from here belong to the new attempt.
        self.recorder.close()
        recorder = StepRecorder.from_env(
            run.run_dir, rank=run.info.rank, attempt=run.attempt, world=run.info.world_size
        )
        assert recorder is not None  # the environment that made the first one is unchanged
        self.recorder = recorder

    def on_finish(self, run: Run) -> None:
        if run.state is not None:
            self.recorder.final(run.state, run.step)

    def on_close(self, run: Run, status: str) -> None:
        self.recorder.close()


class CacheStatsHook(RunHook):
    """The data cache into the ledger: where it is and its budget once per attempt (``cache_config``), its
    counters at each epoch's end and when the run finishes (``cache_stats``)."""

    def __init__(self) -> None:
        self.recorder: CacheStatsRecorder | None = None
        # id(loader), attempt of the last cache_config written (an id: the hook must not keep a loader alive)
        self._declared: tuple[int, int] | None = None

    def on_batches(self, run: Run, loader: Any) -> None:
        self.recorder = CacheStatsRecorder(run.ledger, loader)
        self._declare(run, loader)

    def on_attempt(self, run: Run, kind: str) -> None:
        if self.recorder is not None:  # the loop goes on with the same loader
            self.recorder.follow(run.ledger)
            self._declare(run, run.loader)

    def _declare(self, run: Run, loader: Any) -> None:
        """``cache_config`` once per attempt and loader (a warm re-entry opens the attempt, then reads again)."""
        if self.recorder is not None and self._declared != (id(loader), run.attempt):
            self._declared = (id(loader), run.attempt)
            self.recorder.declare()

    def on_iterator(self, run: Run, loader: Any, first: bool) -> None:
        if self.recorder is not None:
            self.recorder.epoch = int(getattr(loader, "epoch", 0))

    def on_epoch_end(self, run: Run, loader: Any) -> None:
        if self.recorder is not None:
            self.recorder.record()

    def on_finish(self, run: Run) -> None:
        if self.recorder is not None:
            self.recorder.record()
