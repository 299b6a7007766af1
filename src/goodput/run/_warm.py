"""The warm hand-over as a hook of ``Run``: a surviving rank keeps its state across a peer's failure, and a new
generation recovers from it instead of reading a checkpoint.

``WarmWorker`` (``goodput.warm.worker``) speaks the agent's protocol; this adapter calls it at the run's
moments: recover before the checkpoint is read, put the RNG back once the loader's iterator exists, record each
committed step, and stop the failure watch when the run ends. ``Run.warm`` decides whether this process stays
after a failure; ``rejoin`` then carries it and its state into the next generation.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any, NoReturn

from goodput.data._global_batch import regroup
from goodput.data.loader import ResumableLoader
from goodput.faults import fault_point
from goodput.job.folder import FATAL_ERRORS, failure_line, report_failure
from goodput.run.hooks import RunHook
from goodput.warm.boot import collect_failed
from goodput.warm.worker import WarmWorker

if TYPE_CHECKING:
    from goodput.checkpoint.state import TrainingState
    from goodput.run._membership import Membership
    from goodput.run.run import Run
    from goodput.warm.protocol import Generation

__all__ = ["WarmHook", "exit_failed", "generation_loaders", "resized_event"]


class WarmHook(RunHook):
    """The worker side of warm restarts for one ``Run`` (see the module docstring)."""

    def __init__(self, worker: WarmWorker, hang_timeout: float | None = None) -> None:
        self.worker = worker
        self.hang_timeout = (
            hang_timeout  # the script's: how long a hung peer lives before its watchdog ends it
        )
        self._pending: Any = None  # a survivor's state, held from its failure to the next restore
        self._next: int | None = None  # the generation this survivor left its failed one for
        self._first: float | None = None  # when the recovered generation started, until its first step
        self._live = False  # the last restore took the state from a survivor, not a checkpoint
        self._recovering = False  # inside a live recovery: the objects hold no state of this process yet
        self._failed: list[ResumableLoader] = []  # the failed generation's loaders, until the next restore

    def snapshot(self, run: Run) -> None:
        """Keep this survivor's state of ``run.step`` (its manager is about to be dropped with the dead group).

        A failure inside a recovery keeps the state taken before it: the new objects hold nothing yet.
        """
        if not self._recovering:
            self._pending = self.worker.snapshot(run.step, run.state, run.ledger.live_totals())

    def leave(self) -> None:
        """Leave the failed generation and wait to join the next one: at least as long as a hung peer takes
        to be ended by its watchdog (the script's hang timeout) and handed over."""
        wait = 0.0 if self.hang_timeout is None else self.hang_timeout + self.worker.reform_timeout
        self._next = self.worker.leave(at_least=wait)

    def rejoin(self, run: Run, err: BaseException, membership: Membership) -> None:
        """After a peer's failure (``err``): close the failed attempt, keep this survivor's state, leave the
        failed generation and join the next one's group and a new ledger attempt (``run`` then drops its
        checkpoint manager, which was bound to the dead group)."""
        run.end_attempt(f"peer failure: {str(err).splitlines()[0][:200] if str(err) else err!r}")
        self.snapshot(run)
        self._failed = generation_loaders(run)

        def leave() -> None:
            with run.phase("restore"):
                self.leave()

        run.info = membership.rejoin(leave)
        run.begin_attempt("warm", began=self.worker.joined_wall, attempt=membership.attempt)

    def before_restore(self, run: Run, state: TrainingState) -> int | None:
        if not self.worker.live_recovery:
            return None
        start = time.monotonic()
        if self._next is not None:  # a survivor: what its failed generation held is unreachable now
            collect_failed()
        if self.worker.resized:  # a loader kept across generations takes its share of the new world
            regroup(state.loader, run.info.rank, run.info.world_size)
        self._recovering = True
        fault_point("restore")
        step, live = self.worker.recover(self._pending, state)
        self._recovering = False
        if live is not None and self._next is None:  # a new process, not a survivor: the job's figure
            run.ledger.carry_live(live)
        parts = self.worker.parts(time.monotonic() - start, survivor=self._next is not None)
        run.ledger.event("warm_restart", restored_step=step, **parts)
        if self.worker.resized:
            resized_event(run, self.worker.info, step, state)
        self.worker.recovered()
        self._pending = self._next = None
        self._first = time.monotonic()
        self._live = step is not None
        return step

    def on_restore(self, run: Run, state: TrainingState, step: int | None) -> None:
        # The failed generation's loaders are closed once the next one has shown which loader it keeps.
        failed, self._failed = self._failed, []
        for loader in failed:
            if loader is not state.loader:
                loader.close()
        self.worker.state_registered(state)
        self.worker.record_at_backward(state.model)
        # A warm restart before this generation's first completed step hands on the restored step.
        if step is not None:
            self.worker.position_restored(step, state.loader, from_checkpoint=not self._live)
        self._live = False

    def on_iterator(self, run: Run, loader: Any, first: bool) -> None:
        if first:
            self.worker.apply_rng()

    def on_batch(self, run: Run, step: int) -> None:
        # The agent ended this generation (a grow, or a peer's failure): leave at this step boundary, holding
        # the last completed step, rather than start a step whose collectives or optimizer step must fail.
        if self.worker.ending:
            import torch.distributed as dist

            raise dist.DistError(f"goodput: generation {self.worker.gen} ended: leaving before step {step}")

    def on_step(self, run: Run, step: int, loss: float | None) -> bool:
        self.worker.step_committed(step, run.loader)
        if self._first is not None:
            seconds = round(time.monotonic() - self._first, 6)
            run.ledger.event("warm_first_step", step=step, seconds=seconds)
            self._first = None
        return False

    def on_finish(self, run: Run) -> None:
        committed = run.manager.committed if run.state is not None else []
        self.worker.closed(run.step, run.total_steps, committed)

    def on_close(self, run: Run, status: str) -> None:
        self.worker.stop_watch()
        self.worker.record_at_backward(None)


def generation_loaders(run: Run) -> list[ResumableLoader]:
    """The ``ResumableLoader`` s a generation gave to ``run.restore`` and ``run.batches``.

    When the generation fails, those the next one does not keep are closed: nothing reads them again, but what
    they started would live on in this process (DataLoader workers holding open files; the dataset's cache
    prefetch, whose window stays pinned, budget the next generation's reads wait for, until it is read).
    """
    state = run.state
    given = (run.loader, getattr(run.loader, "source", None), state.loader if state is not None else None)
    return list({id(x): x for x in given if isinstance(x, ResumableLoader)}.values())


def resized_event(run: Run, info: Generation | None, step: int | None, state: TrainingState) -> None:
    """The ledger's ``shrink`` or ``grow`` event of a resized generation, as this rank saw it (seconds: from
    the failure's detection, or the newcomer's readiness, to training resumed)."""
    assert info is not None  # a resized generation was joined
    since = info.detected_wall if info.kind == "shrink" else info.ready_wall
    assert since is not None  # the agent stamps every shrink and grow
    fields: dict[str, Any] = {
        "generation": info.gen,
        "step": (step or 0) + 1,
        "world_before": info.world_before,
        "world_after": info.world_size,
        "seconds": round(max(0.0, time.time() - since), 6),
    }
    if info.kind == "shrink":
        fields["failed_ranks"] = info.failed
        keeps = getattr(state.loader, "keeps_global_batch", False)
        fields["batch_rule"] = "per_rank_batch" if keeps else "unchecked"
    else:
        fields["joined"] = info.joined
    run.ledger.event(info.kind, **fields)


def exit_failed(run: Run, err: BaseException, *, planned: bool = False) -> NoReturn:
    """This rank's own failure under warm restarts: record it and exit now, so a spare takes the rank.

    Exiting at once (not through the interpreter's shutdown, which may wait on the process group) lets the
    survivors' collectives fail promptly. The error is reported as the excepthook does (torch's error file;
    ``FATAL`` for an error a restart cannot fix, which the launcher prints in one line and stops the job on).
    ``planned``: a departure goodput chose (the numeric guard hands a corrupt rank to a spare): ``err``'s
    message alone is the report, which the launcher quotes in its one line; nothing else is printed.
    """
    line = failure_line(err, line=str(err) if planned else None)
    # The ledger first: the report may stop the launch (FATAL, NUMERIC), whose kill must find it on disk.
    run.ledger.failure_detected(f"exception on this rank: {line}"[:300])
    for hook in run.hooks:
        hook.on_fail(run)
    run.ledger.close("failed")
    report_failure(run.info.rank, err, line=line)
    if not planned and not isinstance(err, FATAL_ERRORS):
        traceback.print_exception(err)
    sys.stderr.flush()
    os._exit(1)
