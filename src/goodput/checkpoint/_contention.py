"""What a save's background half costs training: the CPU time it takes from the cores training computes on.

An asynchronous save blocks training only while it stages (the stall ``C`` the ``auto`` interval plans with);
its write, replication and commit then run on a background thread. That thread is free for training only when
it runs on a core training does not need. Training computes on the CPU (no accelerator in use in this process)
or the node has no core beyond one per training process: then each CPU second the background thread spends is
a second the training processes do not get, and the interval must count it as part of the save's cost, as it
counts the stall; otherwise the write overlaps for free. Without it the optimum of a tiny stall is to save as
soon as the previous save is durable, which keeps the background writer busy all the time on a host where it
competes with the training it protects.
"""

from __future__ import annotations

import os
import time

__all__ = ["BackgroundCpu"]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def shares_cores_with_training() -> bool:
    """Whether a background thread of this process competes with training for a core (see the module)."""
    import torch

    on_accelerator = torch.cuda.is_available() and torch.cuda.is_initialized()
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or "1")
    return not on_accelerator or _cores() <= local_processes


class BackgroundCpu:
    """The CPU seconds one background job of a save takes from training, measured on the thread that runs it.

    Created on that thread when the job starts; :meth:`charged` at its end is the thread's CPU time since then
    when the thread competes with training for a core, else 0.
    """

    def __init__(self) -> None:
        self._start = time.thread_time()

    def charged(self) -> float:
        if not shares_cores_with_training():
            return 0.0
        return max(0.0, time.thread_time() - self._start)
