"""Ending gloo process groups while the interpreter is still whole: their worker threads are joined, not left behind.

Why: a gloo group's worker thread (torch's ``ProcessGroupGloo::runLoop``) drops its reference to each finished
collective only after the caller's ``wait()`` has returned. When the collective's tensors were made in Python
(``all_gather_object``, ``broadcast_object_list``, ``gather_object`` build them and drop them at once), that drop
is the tensors' last C++ reference, and torch hands their Python objects back under the GIL
(``TensorImpl::decref_pyobject`` from ``~AsyncAllgatherWork``). If the process is exiting by then, Python's
finalization has begun, and a thread taking the GIL is ended with ``pthread_exit``; its unwinding through that
``noexcept`` destructor calls ``std::terminate``: "terminate called without an active exception", SIGABRT, exit
status 134 instead of the process's own, after all its Python code ran (in a fraction of runs: it is a race).
Destroying the group alone does not prevent it; destroying it and dropping its last reference does.

``destroy_process_group`` only unregisters a group. The threads end when the group object itself is destroyed:
torch binds ``ProcessGroup`` with a holder that releases the GIL around the C++ destructor, and
``~ProcessGroupGloo`` waits for the queue to empty and joins its workers, which can then take the GIL and finish.
So the caller must hold no other reference to the group (nor let any object that does live on).
"""

from __future__ import annotations

import gc
import sys
from typing import Any

__all__: list[str] = []


def release_groups(groups: list[Any]) -> None:
    """Destroy each group in ``groups`` and drop it (the list is emptied), joining its gloo threads now.

    The caller has already let go of its other references. A failed DCP load leaves one more behind: its
    exception's traceback keeps torch's frames (which hold the group) in a reference cycle, so when a group is
    still referenced elsewhere one garbage collection runs first. A group that even then is referenced elsewhere
    is unregistered but lives on, with its threads, until that reference goes. Call this only after the last
    collective on the groups has returned (the join would wait for one still running).
    """
    _destroy_each(groups)
    if any(_held_elsewhere(group) for group in groups):
        gc.collect()
    groups.clear()  # the last references: ProcessGroupGloo's destructor joins its threads, without the GIL


def _destroy_each(groups: list[Any]) -> None:
    # a function of its own: a loop in release_groups would leave its variable holding the last group, which
    # _held_elsewhere would count as a reference elsewhere (a needless full collection at every close)
    import torch.distributed as dist

    for group in groups:
        dist.destroy_process_group(group)


def _held_elsewhere(group: Any) -> bool:
    # this call's argument and getrefcount's own, plus the caller's list and its loop variable
    return sys.getrefcount(group) > 4
