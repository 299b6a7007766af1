"""Signals and lifetimes: the preemption signal both sides name, and that no process of the job outlives
``goodput launch``.

The launcher parses ``--preempt-signal`` and exports it (``$GOODPUT_PREEMPT_SIGNAL``); every rank's
:class:`~goodput.run.signals.PreemptionWatch` parses the same name. The launcher becomes a child subreaper
(Linux), so workers orphaned by a dying torchrun are re-parented to it and can still be found (``descendants``)
and ended; it exports its pid (``$GOODPUT_LAUNCHER_PID``), and each worker ends with its parent, or at once when
the launcher is already gone (``end_with_launcher``).
"""

from __future__ import annotations

import contextlib
import os
import signal

from goodput._env import LAUNCH_DIR, LAUNCHER_PID, PREEMPT_SIGNAL
from goodput._lifetime import end_with_parent, pid_exists, preload_libc
from goodput.errors import ConfigError

__all__ = [
    "LAUNCHER_PID_ENV",
    "PREEMPT_SIGNAL_ENV",
    "become_subreaper",
    "descendants",
    "end_with_launcher",
    "parse_signal",
]

PREEMPT_SIGNAL_ENV = PREEMPT_SIGNAL.name
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def parse_signal(name: str) -> signal.Signals:
    """A signal from its name (``USR1``, ``SIGUSR1``, ``usr1``) or number.

    Raises:
        ConfigError: when it is not a signal that can be caught.
    """
    text = name.strip().upper()
    try:
        sig = (
            signal.Signals(int(text))
            if text.isdigit()
            else signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
        )
    except (KeyError, ValueError):
        raise ConfigError(f"--preempt-signal {name!r} is not a signal name such as USR1 or TERM") from None
    if sig in _UNCATCHABLE:
        raise ConfigError(f"--preempt-signal {name!r} cannot be caught; use e.g. USR1")
    return sig


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux ``PR_SET_CHILD_SUBREAPER``)."""
    libc = preload_libc()
    try:
        return libc is not None and int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except AttributeError:
        return False


LAUNCHER_PID_ENV = LAUNCHER_PID.name


def end_with_launcher() -> None:
    """Under ``goodput launch`` (``$GOODPUT_LAUNCH_DIR`` set), end this worker when its parent ends.

    A worker asks only once its interpreter has started, so its parent (torchrun, the warm agent) may have ended
    before: the worker then has the launcher (a subreaper) for a parent, or, the launcher gone too, another
    process; either way it ends at once.
    """
    if not LAUNCH_DIR.get():
        return
    end_with_parent()
    launcher = int(LAUNCHER_PID.get() or 0)
    if launcher and (os.getppid() == launcher or not pid_exists(launcher)):
        os.kill(os.getpid(), signal.SIGKILL)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
            found += [int(p) for p in f.read().split()]
    return found


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first), read from ``/proc``."""
    out: list[int] = []
    todo = _children(pid)
    while todo:
        child = todo.pop(0)
        if child not in out:
            out.append(child)
            todo += _children(child)
    return out
