"""One daemon thread that runs a durable tier's background halves (asynchronous saves' writes and commits) in order.

Not a ``ThreadPoolExecutor``: the interpreter joins its threads at exit. Under warm restarts a rank leaves an
ended generation without waiting for the save in flight (``DurableCheckpointer.settle``), and that save's
thread may stay blocked in a collective of a group the rank has since shut down, whose work never runs: the
process would then never exit. A daemon thread is not joined, so the process ends as its script does.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["Finisher"]

T = TypeVar("T")
_Job = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...]]


class Finisher:
    """Runs submitted calls one at a time, in order, on a daemon thread started at the first one."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``fn(*args)``; its future."""
        future: Future[T] = Future()
        self._jobs.put((future, fn, args))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        return future

    def shutdown(self, wait: bool = True) -> None:
        """Run what is queued, then end the thread (``wait``: until it has ended)."""
        self._jobs.put(None)
        if wait and self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as err:  # as a ThreadPoolExecutor's worker: the caller sees it
                    future.set_exception(err)
