"""A process's lifetime tied to its parent's: the kernel ends it when its parent ends (Linux).

One helper for every process goodput starts, or has started for it, that must not outlive the process that
started it: torchrun or the warm agent under ``goodput launch``, each worker under them, and the DataLoader's
worker processes under a rank. A SIGKILLed parent runs no clean-up of its own; ``PR_SET_PDEATHSIG`` makes the
kernel send its children SIGKILL instead; ``pid_exists`` asks whether one is still there. A leaf module (no goodput imports), so ``data/`` and ``run/`` share it.
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Any

__all__ = ["end_with_parent", "pid_exists", "preload_libc"]

_PR_SET_PDEATHSIG = 1
_LIBC: list[Any] = []  # loaded once, before a fork: a child between fork and exec must not load a library


def preload_libc() -> Any:
    """libc for ``prctl``, loaded on the first call (call it before forking a child that uses it)."""
    if not _LIBC:
        try:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]


def end_with_parent(parent: int | None = None) -> bool:
    """Have the kernel SIGKILL this process when its parent ends (Linux ``PR_SET_PDEATHSIG``).

    ``parent``: the pid the parent had (None: the current one); a process whose parent has already changed ends
    at once, since nobody would signal it. The signal comes when the *thread* that started this process ends,
    so ask for it only in a child started by a thread that lives as long as its process (the main thread).
    Returns False where the request is not supported.
    """
    parent = os.getppid() if parent is None else parent
    libc = preload_libc()
    try:
        if libc is None or int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) != 0:
            return False
    except AttributeError:
        return False
    if os.getppid() != parent:  # the parent ended before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def pid_exists(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts, and so does a zombie not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited: a zombie (a killed child not yet reaped) has."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # gone, or no /proc to read
        return pid_exists(pid)
