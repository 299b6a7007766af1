"""Preemption: a signal asks the job to stop; every rank finishes its step and the job saves once.

Who hears the signal. A scheduler or a container runtime signals the job's main process (``goodput launch``),
Ctrl-C signals the terminal's foreground group (the launcher alone: torchrun and its workers run in sessions of
their own), and SLURM's ``--signal=USR1@90`` may signal every process of the job. So both sides listen:

* the launcher catches SIGTERM, SIGINT and the preemption signal, and forwards the preemption signal to every
  rank's process (each rank writes its pid into the launch folder once its handler is installed);
* each rank's :class:`PreemptionWatch` catches the preemption signal (``$GOODPUT_PREEMPT_SIGNAL``, default
  ``USR1``) and only sets a flag. SIGTERM keeps its default inside the workers: torchrun ends a failed group's
  survivors with it, and they must die at once for the restart to be quick.

Agreeing on the step. The signal reaches ranks at different steps, and every rank must save the same step. An
all-reduce of the flag at every step would add a collective (a synchronisation point) to every step. Instead
the ranks meet at *check steps*: at each one they all-reduce two integers on a gloo group of their own, the
flag (any rank that saw the signal) and the next check step, chosen by rank 0 so that checks come about every
``check_seconds`` (2 s by default) from its measured step time. The all-reduce is started at the check step
and its answer read one step later, so no rank waits for the others there (a blocking all-reduce would make
each rank wait for the slowest): every rank reads the same answer at the same
step, and stops after it. Cost: one 2-integer CPU all-reduce per ``check_seconds``, in the background; the
price is a delay of at most ``check_seconds`` plus two steps between the signal and the agreed save, far
inside a scheduler's grace period. A single process checks its flag at every step, for free.

The signal's name and that no process of the job outlives the launcher are the job's contract
(:mod:`goodput.job.signals`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from goodput._env import PREEMPT_SIGNAL
from goodput.job.signals import parse_signal

__all__ = ["PreemptionWatch"]


class PreemptionWatch:
    """One rank's view of a preemption request, and the agreement on the step at which every rank stops.

    Args:
        rank: this rank.
        world_size: ranks in the job; above 1 the watch makes a gloo group (a collective: every rank creates
            its watch at the same point).
        signum: the preemption signal (None: ``$GOODPUT_PREEMPT_SIGNAL``, default USR1).
        check_seconds: about how often ranks meet to agree (see the module docstring).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        signum: int | None = None,
        check_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.signum = signum or parse_signal(PREEMPT_SIGNAL.get())
        self.requested: str | None = None  # the name of the signal that asked, once one did
        self._check_seconds = check_seconds
        self._clock = clock
        self._previous: Any = None
        self._installed = False
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(self.signum, self._on_signal)
            self._installed = True
        self._group: Any = None
        self._pending: tuple[Any, Any] | None = None  # (work, tensor) of the all-reduce started last step
        self.join_group()
        self._next_check = 1
        self._mark: tuple[int, float] = (0, clock())

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only a flag: the step in progress finishes, and the ranks agree on where to stop at the next check.
        self.requested = signal.Signals(signum).name

    def request(self, reason: str) -> None:
        """Ask for a stop from code (as the signal does)."""
        self.requested = reason

    def start(self, step: int) -> None:
        """The loop starts after ``step``: the first check is at the next step."""
        self._next_check = step + 1
        self._pending = None
        self._mark = (step, self._clock())

    def should_stop(self, step: int) -> bool:
        """Whether every rank stops after ``step`` (the same answer on every rank)."""
        if self._group is None:
            return self.requested is not None
        if self._pending is not None:  # started at the check step before this one: every rank reads it here
            work, both = self._pending
            self._pending = None
            work.wait()
            self._next_check = int(both[1])
            if both[0] and self.requested is None:
                self.requested = "another rank"
            return bool(both[0])
        if step >= self._next_check:
            self._pending = self._start_check(step)
        return False

    def _start_check(self, step: int) -> tuple[Any, Any]:
        import torch
        import torch.distributed as dist

        following = 0
        if self.rank == 0:
            last_step, last_time = self._mark
            now = self._clock()
            per_step = (now - last_time) / max(1, step - last_step)
            following = step + 1 + max(1, min(10_000, int(self._check_seconds / max(per_step, 1e-6))))
            self._mark = (step, now)
        both = torch.tensor([int(self.requested is not None), following], dtype=torch.int64)
        work = dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return work, both

    @property
    def group(self) -> Any:
        """The gloo group of every rank the watch agrees over (None: a world of one rank)."""
        return self._group

    def join_group(self) -> None:
        """Make the group the ranks agree on (a collective over the current default group)."""
        self.leave_group()
        if self.world_size > 1:
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")

    def leave_group(self) -> None:
        """Release the group, keeping the signal handler and any request: a warm restart drops the group with
        its generation and joins the next one's, and a signal meanwhile must neither kill nor be forgotten."""
        self._pending = None  # a check in flight on the old group is abandoned with it
        if self._group is not None:
            import torch.distributed as dist

            with contextlib.suppress(Exception):
                dist.destroy_process_group(self._group)
            self._group = None

    def close(self) -> None:
        """Give the signal back to its previous handler and release the group."""
        if self._installed:
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(self.signum, self._previous)
            self._installed = False
        self.leave_group()
