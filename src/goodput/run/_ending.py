"""How a run ends: ``close()``, a failure out of ``with Run(...)``, and a preemption stop, each at most once.

Kept apart from ``run.py`` so that the Run holds the order of a step and this module the end's own state
(whether the run is closed, which step was saved last).

* ``close()`` saves the last step unless it is saved, waits until it is durable (a store that refuses that save
  is given ``$GOODPUT_FINAL_SAVE_TIMEOUT`` seconds: the manager tries it again meanwhile) and tells the hooks
  (``on_finish``); then the run lets go of what it holds: the hooks in reverse order (``on_close``), the
  ledger, the fault plan, the process group. An exception out of ``with Run(...)`` only lets go.
* A preemption stop saves the agreed step, waits until it is durable, records ``preempted`` in the ledger,
  reports the checkpoint to the launcher (or prints the line itself without one) and ends the process.
* A warm restart opens the run again: the next generation's ``train(run)`` closes it in its turn.

:class:`StepChecks` keeps the time the hooks take after each step's end (the numeric guard's verdict, the
straggler detector's): goodput's own work between steps, which the ledger counts in ``other``. It goes into the
ledger as a ``post_step_checks`` event (``seconds``, ``steps``) every :data:`CHECKS_EVERY` steps and as the run lets
go, so that ``goodput report`` names it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, NoReturn

from goodput.faults import install_faults
from goodput.job.folder import PREEMPTED_FILE, launch_dir, write_marker

if TYPE_CHECKING:
    from goodput.run._batches import BatchLoop
    from goodput.run._membership import Membership
    from goodput.run.run import Run

__all__ = ["RunEnd", "StepChecks", "exit_preempted", "report_preempted"]

CHECKS_EVERY = 500  # steps between two post_step_checks events


class StepChecks:
    """The hooks' time after each step's end (see the module docstring)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.steps = 0

    def add(self, ledger: Any, seconds: float) -> None:
        """One step's hooks took ``seconds``: add them, and write the event when it is due."""
        self.seconds += seconds
        self.steps += 1
        if self.steps >= CHECKS_EVERY:
            self.flush(ledger)

    def flush(self, ledger: Any) -> None:
        if self.steps:
            ledger.event("post_step_checks", seconds=round(self.seconds, 6), steps=self.steps)
            self.seconds, self.steps = 0.0, 0


class RunEnd:
    """The end of one ``Run`` (see the module docstring).

    Args:
        loop: the run's batch loop: stopped first, and asked on a clean close whether the last steps stand.
        membership: the run's place in the job, left last.
    """

    def __init__(self, loop: BatchLoop, membership: Membership) -> None:
        self.loop = loop
        self.membership = membership
        self.closed = False
        self.checks = StepChecks()
        self.last_saved: int | None = None  # the step the newest save holds: close() does not save it again

    def close(self, run: Run, status: str) -> None:
        """End ``run`` with ``status`` (``ok`` or ``interrupted``): save its last step, wait until it is durable,
        then let go. A second call does nothing."""
        if self.closed:
            return
        self.closed = True
        self.loop.stop()
        try:
            if run.state is not None:  # restored: a checkpoint manager is open
                if status == "ok":
                    self.loop.loop_end_rewound(run, closing=True)
                with run.phase("checkpoint_save"):  # the final save, tried again while the store refuses it
                    run.manager.close(run.step, guard=lambda: run.phase("checkpoint_save"))
            for hook in run.hooks:
                hook.on_finish(run)
        finally:
            self.release(run, status)

    def fail(self, run: Run) -> None:
        """An exception ends ``run``: let go of what it holds, save nothing (unless it is closed already)."""
        if not self.closed:
            self.closed = True
            self.release(run, "failed")

    def release(self, run: Run, status: str) -> None:
        """Let go of what ``run`` holds: its hooks (last added first), its ledger, its fault plan, its group."""
        for hook in reversed(run.hooks):
            hook.on_close(run, status)
        self.checks.flush(run.ledger)
        run.ledger.close(status)
        install_faults(None)
        self.membership.close()

    def stop_preempted(self, run: Run, why: str) -> NoReturn:
        """Save ``run``'s current step durably on every rank, report it, close the run and end the process."""
        self.save_last(run)
        with run.phase("checkpoint_save"):
            result = run.manager.wait()
        url = report_preempted(run, result, why)
        self.close(run, "interrupted")
        exit_preempted(run, url, why)

    def save_last(self, run: Run) -> None:
        """Save ``run``'s current step unless the newest save holds it."""
        if self.last_saved != run.step:
            run.save()


def report_preempted(run: Run, result: Any, why: str) -> str | None:
    """Record the preemption stop in the ledger; the URL of the durable checkpoint it saved (or the last one)."""
    manager = run.manager
    url = result.url if result is not None else (manager.results[-1].url if manager.results else None)
    run.ledger.event("preempted", step=run.step, signal=why, url=url)
    return url


def exit_preempted(run: Run, url: str | None, why: str) -> NoReturn:
    """Tell the launcher (or the user, without one) where the preempted run saved, and end the process."""
    from goodput.job.codes import EXIT_PREEMPTED

    if run.info.rank == 0:
        info = {"step": run.step, "url": url, "run_dir": run.run_dir, "signal": why}
        if not write_marker(PREEMPTED_FILE, info):
            print(
                f"goodput: preempted by {why}: saved step {run.step} to {url or run.run_dir}; run the same "
                f"command again to resume (exit {EXIT_PREEMPTED})",
                file=sys.stderr,
                flush=True,
            )
    raise SystemExit(0 if launch_dir() is not None else EXIT_PREEMPTED)
