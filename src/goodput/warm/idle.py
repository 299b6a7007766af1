"""Hot spares wait at idle CPU priority, so their imports use only CPU time training leaves unused.

A spare imports torch and the training script's imports (seconds of CPU) while the job trains. On a node whose
cores the ranks keep busy, that work slows the ranks' steps and starves their data workers in the steps after
each warm restart (when a new spare starts). Under ``SCHED_IDLE`` the
spare runs only when a core would otherwise idle; when it is handed a rank, the agent puts every thread of it
back under the normal policy (a spare still importing then finishes at full speed).

Leaving ``SCHED_IDLE`` needs privilege: the agent uses it only as root or when ``RLIMIT_NICE`` permits nice 0;
otherwise spares start at the normal policy.
"""

from __future__ import annotations

import contextlib
import os
import resource

__all__ = ["can_return", "make_idle", "make_normal"]


def can_return() -> bool:
    """Whether this user may put a process back from ``SCHED_IDLE`` to the normal policy."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    if os.geteuid() == 0:
        return True
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or soft >= 20


def make_idle(pid: int) -> bool:
    """Put process ``pid``'s main thread (and the threads it starts later) under ``SCHED_IDLE``."""
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        return False
    return True


def make_normal(pid: int) -> None:
    """Every thread of process ``pid`` back under the normal policy."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tasks = [str(pid)]
    for tid in tasks:
        with contextlib.suppress(OSError, ValueError):
            os.sched_setscheduler(int(tid), os.SCHED_OTHER, os.sched_param(0))
