"""Leave a failed generation at the agent's word: stop the optimizer, and break what a collective is blocked on.

A survivor learns of a peer's failure from its own collectives, and not always soon. NCCL does not notice: a
collective blocked on a dead peer spins on the GPU until the process group's timeout, and its watchdog then, by
default (``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``), ends the whole process, turning a warm restart into a cold one.
gloo notices only on the connections to the dead peer: from 3 ranks on, a rank whose collective reads from
another survivor waits out the timeout. The agent knows sooner: it sees the worker exit and writes
``gen/<g>/next`` at once.

:class:`EndWatch` polls that key from a thread of its own, with its own connection to the agent's store. When it
appears, the watch marks the generation ended and calls what the worker gave it for the backend: on NCCL, abort
every communicator of the process (PyTorch's documented ``ProcessGroup.abort``, i.e. ``ncclCommAbort``); on gloo,
whose abort does nothing, hang up the generation's connections (:mod:`goodput.warm.hangup`). Either returns the
blocked collective with an error. An aborted collective may also return with its output unfinished, so the mark
guards the optimizer too: a global optimizer pre-step hook raises a ``DistBackendError`` once the generation has
ended, so no rank applies gradients that did not come from every rank. The rank then leaves through
``Run.warm`` like any peer failure, holding its last completed step.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from goodput.warm.store import WarmStore

__all__ = ["EndWatch", "install_optimizer_guard"]

POLL_SECONDS = 0.1


class EndWatch:
    """Watches for the end of generation ``gen`` (the agent's ``gen/<gen>/next``) in a daemon thread."""

    def __init__(
        self, address: str, prefix: str, gen: int, *, on_end: Callable[[], object] | None = None
    ) -> None:
        self.gen = gen
        self.ended = threading.Event()  # set when the agent ended this generation
        self._on_end = on_end  # breaks the collectives blocked on the generation
        self._stop = threading.Event()
        self._address = address
        self._prefix = prefix
        self._thread = threading.Thread(target=self._watch, name=f"goodput-warm-watch-{gen}", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            store = WarmStore.connect(self._address, self._prefix)
            while not self._stop.wait(POLL_SECONDS):
                if store.ended(self.gen):
                    break
            else:
                return
        except Exception:  # the agent's store is gone: the agent ends this process itself
            return
        if self._stop.is_set():
            return
        self.ended.set()
        if self._on_end is not None:
            self._on_end()

    def stop(self) -> None:
        """Stop watching (this generation is left, or the run closed) and wait for the thread."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)


def abort_communicators() -> None:
    """Abort the communicators of every process group of this process, leaving the groups registered.

    ``ProcessGroup.abort`` aborts each backend's communicators (NCCL's; gloo's is a no-op) without touching the
    Python registry of groups, which the training thread may be using at that moment: the teardown of the
    registry stays on the training thread, in ``WarmWorker.leave``.
    """
    import torch.distributed as dist

    for group in list(dist.distributed_c10d._world.pg_map):
        try:
            group.abort()
        except Exception:  # already aborted or shut down: nothing is blocked on it
            continue


_guard_lock = threading.Lock()
# the current generation's watch and what to call before an optimizer step; [] until the hook is installed
_guarded: list[tuple[EndWatch | None, Callable[[], None] | None]] = []


def install_optimizer_guard(watch: EndWatch | None, before_step: Callable[[], None] | None = None) -> None:
    """Make every optimizer step of this process refuse to run once ``watch``'s generation has ended, and
    call ``before_step`` before each step it lets run.

    Installed once per process (a global pre-step hook); later generations only swap what it holds.
    """
    with _guard_lock:
        if not _guarded:
            import torch.optim.optimizer as optim

            optim.register_optimizer_step_pre_hook(_refuse_after_end)
            _guarded.append((watch, before_step))
        else:
            _guarded[0] = (watch, before_step)


def _refuse_after_end(optimizer: Any, args: Any, kwargs: Any) -> None:
    watch, before_step = _guarded[0] if _guarded else (None, None)
    if watch is not None and watch.ended.is_set():
        import torch.distributed as dist

        raise dist.DistBackendError(
            f"goodput: generation {watch.gen} ended (another rank failed): this optimizer step is not applied "
            f"(pid {os.getpid()})"
        )
    if before_step is not None:
        before_step()
