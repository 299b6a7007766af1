"""One daemon thread that runs a durable tier's background halves (asynchronous saves' writes and commits) in order.

Not a ``ThreadPoolExecutor``: the interpreter joins its threads at exit. Under warm restarts a rank leaves an
ended generation without waiting for the save in flight (``DurableCheckpointer.settle``), and that save's
thread may stay blocked in a collective of a group the rank has since shut down, whose work never runs: the
process would then never exit. A daemon thread is not joined, so the process ends as its script does.

As a ``ThreadPoolExecutor``'s worker does, the thread holds no reference to its owner nor, between calls, to the
last call (its bound method would keep the dropped manager's process groups alive, with their threads and
sockets, one set per warm generation), and it ends once its owner is collected.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["Finisher"]

T = TypeVar("T")
_Jobs = queue.SimpleQueue[tuple["Future[Any]", Callable[..., Any], tuple[Any, ...]] | None]


class Finisher:
    """Runs submitted calls one at a time, in order, on a daemon thread started at the first one."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: _Jobs = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        weakref.finalize(self, self._jobs.put, None)  # collected: the thread ends after what is queued

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``fn(*args)``; its future."""
        future: Future[T] = Future()
        self._jobs.put((future, fn, args))
        if self._thread is None:
            self._thread = threading.Thread(target=_run, args=(self._jobs,), name=self._name, daemon=True)
            self._thread.start()
        return future

    def shutdown(self, wait: bool = True) -> None:
        """Run what is queued, then end the thread (``wait``: until it has ended)."""
        self._jobs.put(None)
        if wait and self._thread is not None:
            self._thread.join()


def _run(jobs: _Jobs) -> None:
    while (job := jobs.get()) is not None:
        future, fn, args = job
        del job
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as err:  # as a ThreadPoolExecutor's worker: the caller sees it
                future.set_exception(err)
        del future, fn, args  # the last call's objects are not kept while the thread waits for the next
