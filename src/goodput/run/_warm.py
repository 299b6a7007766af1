"""The warm hand-over as a hook of ``Run``: a surviving rank keeps its state across a peer's failure, and a new
generation recovers from it instead of reading a checkpoint.

``WarmWorker`` (``goodput.warm.worker``) speaks the agent's protocol; this adapter calls it at the run's
moments: recover before the checkpoint is read, put the RNG back once the loader's iterator exists, record each
committed step, and stop the failure watch when the run ends. ``Run.warm`` drives the failure path itself
(``snapshot`` and ``leave``) because it decides whether this process stays.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any, NoReturn

from goodput.faults import fault_point
from goodput.launch.folder import FATAL_ERRORS, report_failure
from goodput.run.hooks import RunHook
from goodput.warm.worker import WarmWorker

if TYPE_CHECKING:
    from goodput.checkpoint.state import TrainingState
    from goodput.run.run import Run

__all__ = ["WarmHook", "exit_failed"]


class WarmHook(RunHook):
    """The worker side of warm restarts for one ``Run`` (see the module docstring)."""

    def __init__(self, worker: WarmWorker) -> None:
        self.worker = worker
        self._pending: Any = None  # a survivor's state, held from its failure to the next restore
        self._next: dict[str, Any] | None = None  # what the agent said about the next generation
        self._first: float | None = None  # when the recovered generation started, until its first step
        self._live = False  # the last restore took the state from a survivor, not a checkpoint

    def snapshot(self, run: Run) -> None:
        """Keep this survivor's state of ``run.step`` (its manager is about to be dropped with the dead group)."""
        self._pending = self.worker.snapshot(run.step, run.state)

    def leave(self) -> None:
        """Leave the failed generation and wait to join the next one."""
        self._next = self.worker.leave()

    def before_restore(self, run: Run, state: TrainingState) -> int | None:
        if not self.worker.live_recovery:
            return None
        start = time.monotonic()
        fault_point("restore")
        step = self.worker.recover(self._pending, state)
        parts = self.worker.parts(time.monotonic() - start, self._next)
        run.ledger.event("warm_restart", restored_step=step, **parts)
        self.worker.recovered()
        self._pending = self._next = None
        self._first = time.monotonic()
        self._live = step is not None
        return step

    def on_restore(self, run: Run, state: TrainingState, step: int | None) -> None:
        # A warm restart before this generation's first completed step hands on the restored step.
        if step is not None:
            self.worker.position_restored(step, state.loader, from_checkpoint=not self._live)
        self._live = False

    def on_iterator(self, run: Run, loader: Any, first: bool) -> None:
        if first:
            self.worker.apply_rng()

    def on_step(self, run: Run, step: int, loss: float | None) -> bool:
        self.worker.step_committed(step, run.loader)
        if self._first is not None:
            seconds = round(time.monotonic() - self._first, 6)
            run.ledger.event("warm_first_step", step=step, seconds=seconds)
            self._first = None
        return False

    def on_close(self, run: Run, status: str) -> None:
        self.worker.stop_watch()


def exit_failed(run: Run, err: BaseException) -> NoReturn:
    """This rank's own failure under warm restarts: record it and exit now, so a spare takes the rank.

    Exiting at once (not through the interpreter's shutdown, which may wait on the process group) lets the
    survivors' collectives fail promptly. The error is reported as the excepthook does (torch's error file;
    ``FATAL`` for an error a restart cannot fix, which the launcher prints in one line and stops the job on).
    """
    line = report_failure(run.info.rank, err)
    if not isinstance(err, FATAL_ERRORS):
        traceback.print_exception(err)
    run.ledger.failure_detected(f"exception on this rank: {line}"[:300])
    for hook in run.hooks:
        hook.on_fail(run)
    run.ledger.close("failed")
    sys.stderr.flush()
    os._exit(1)
