"""DCP's imports, taken off a new process's way to its first step.

``torch.distributed.checkpoint`` brings DTensor, ``torch.fx``'s symbolic shapes and sympy with it: about 0.6 s of
CPU per process on 2 busy cores, a third of a rank's time from its process start to its first step, and nothing
before the first save or the first restore of a checkpoint needs it. So goodput's checkpoint modules import it
only where they use it, and :class:`CheckpointManager` starts :func:`prewarm` in a background thread once the
first step is done: by the first save (seconds later) the modules are loaded, and the import's CPU time is spent
while the first steps run instead of before them. It is moved, not removed: the steps during the import pay
for it (the thread competes with them for the GIL and the CPU).

Every place that imports a DCP module on the training thread calls :func:`settle` first. It waits for a running
prewarm, so two threads never import the same package tree at once (which Python may answer with a
``_DeadlockError`` when each holds a module lock the other needs).
"""

from __future__ import annotations

import importlib
import threading

__all__ = ["MODULES", "prewarm", "prewarm_in_background", "settle"]

# the DCP modules a save or restore imports first (each imports the rest of the tree it needs)
MODULES = (
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.tensor",
)

_lock = threading.Lock()
_thread: threading.Thread | None = None


def prewarm(extra: tuple[str, ...] = ()) -> None:
    """Import DCP's modules (and ``extra`` ones, e.g. a strategy's module) in this thread."""
    for name in (*MODULES, *extra):
        try:
            importlib.import_module(name)
        except ImportError:  # torch built without distributed: the user's save reports it
            return


def prewarm_in_background(extra: tuple[str, ...] = ()) -> None:
    """Start :func:`prewarm` in a daemon thread (once per process; later calls do nothing)."""
    global _thread
    with _lock:
        if _thread is not None:
            return
        _thread = threading.Thread(target=prewarm, args=(extra,), name="goodput-prewarm", daemon=True)
        _thread.start()


def settle() -> None:
    """Wait for a running background prewarm (no-op when none runs); call before importing a DCP module."""
    thread = _thread
    if thread is not None and thread is not threading.current_thread():
        thread.join()
