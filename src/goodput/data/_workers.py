"""The DataLoader's worker processes end with the rank that started them.

torch's DataLoader workers notice their parent's death only by polling it (every few seconds), so a rank that
is SIGKILLed, or whose launcher is, leaves them running a while. ``ResumableLoader`` gives the DataLoader a
``worker_init_fn`` that first asks the kernel to end the worker with its parent (``PR_SET_PDEATHSIG``), then
calls the user's own ``worker_init_fn``, if any.

The kernel's signal follows the *thread* that started the worker, so the request is made only when the workers
were started by the rank's main thread (the iteration began there) and the worker's parent is that rank (not,
say, a ``forkserver``); otherwise torch's polling still ends them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from goodput._lifetime import end_with_parent

__all__ = ["EndWithParent"]


class EndWithParent:
    """A DataLoader ``worker_init_fn``: end the worker with its parent, then run ``then(worker_id)``.

    Picklable (a module-level class holding the user's function), so spawned workers receive it too.

    Args:
        then: the user's ``worker_init_fn`` (None: none).
    """

    def __init__(self, then: Callable[[int], None] | None = None) -> None:
        self.then = then
        self.parent: int | None = None  # the rank's pid, when its main thread starts the workers

    def starting(self) -> None:
        """Called just before the DataLoader starts its workers: note who starts them."""
        main = threading.current_thread() is threading.main_thread()
        self.parent = os.getpid() if main else None

    def __call__(self, worker_id: int) -> None:
        if self.parent is not None and os.getppid() == self.parent:
            end_with_parent(self.parent)
        if self.then is not None:
            self.then(worker_id)
