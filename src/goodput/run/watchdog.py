"""A hang watchdog: a rank that makes no progress for too long is ended so torchrun restarts the group.

A collective that never returns (a dead peer, a wedged NCCL kernel) blocks a rank forever, and torchrun only
restarts workers that exit. The watchdog runs in a daemon thread; the training loop calls ``beat()`` after each
step, and wraps long phases (checkpoint save and restore) in ``phase(name)``, which allows a longer timeout.
When the time since the last beat exceeds the timeout, the watchdog prints the stack of every thread of the
process (where it hung: a collective, a batch that never came), calls ``on_hang(seconds, phase)`` (the ledger
records ``failure_detected`` there) and ends the process with ``EXIT_HANG``.

The job's collectives time out later than the watchdog (:func:`collective_timeout`), so that a hang ends in
every rank's stacks and the watchdog's verdict rather than in a peer's collective timeout, which says nothing
of the rank that hung.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

from goodput.errors import ConfigError
from goodput.job.codes import EXIT_HANG

__all__ = ["HANG_TIMEOUT", "PHASE_FACTOR", "Watchdog", "collective_timeout"]

HANG_TIMEOUT = 300.0  # Run's default: seconds without a step before a rank counts as hung
PHASE_FACTOR = 4  # the default limit inside a phase (checkpoint save or restore), in timeouts
COLLECTIVE_TIMEOUT = 300.0  # the process group's timeout with the watchdog off
_COLLECTIVE_MARGIN = 60.0  # how much later than the watchdog a collective times out


def collective_timeout(hang_timeout: float | None) -> float:
    """The process group's timeout for a run whose watchdog fires after ``hang_timeout`` seconds (None: off):
    later than the watchdog, so that a hang is the watchdog's to report (see the module docstring)."""
    if hang_timeout is None:
        return COLLECTIVE_TIMEOUT
    return max(COLLECTIVE_TIMEOUT, hang_timeout + _COLLECTIVE_MARGIN)


class Watchdog:
    """Ends this process when it makes no progress for ``timeout`` seconds (``phase_timeout`` in a phase).

    Args:
        timeout: seconds without a ``beat()`` before the process counts as hung.
        phase_timeout: the limit inside ``phase(...)`` blocks (checkpoint save/restore); default 4x timeout.
        on_hang: called with (seconds since the last beat, phase or None) before the process exits.
        exit: how to end the process (tests may pass their own); default ``os._exit``.
    """

    def __init__(
        self,
        timeout: float,
        *,
        phase_timeout: float | None = None,
        on_hang: Callable[[float, str | None], None] | None = None,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        if timeout <= 0:
            raise ConfigError(f"watchdog timeout must be > 0 seconds, got {timeout}")
        self.timeout = timeout
        self.phase_timeout = phase_timeout if phase_timeout is not None else PHASE_FACTOR * timeout
        self._on_hang = on_hang
        self._exit = exit
        self._last = time.monotonic()
        self._phase: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="goodput-watchdog", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        """Record progress (call after every step)."""
        self._last = time.monotonic()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A long phase (e.g. ``checkpoint_save``) that may take up to ``phase_timeout``; entered again inside
        one (each try of a final save), it renews the time allowed and gives the outer phase back at its end."""
        outer = self._phase
        self._phase, self._last = name, time.monotonic()
        try:
            yield
        finally:
            self._phase, self._last = outer, time.monotonic()

    def close(self) -> None:
        """Stop watching."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            limit = self.phase_timeout if self._phase is not None else self.timeout
            idle = time.monotonic() - self._last
            if idle > limit:
                where = f" in phase {self._phase}" if self._phase else ""
                print(f"goodput: no progress for {idle:.1f}s{where}; ending this rank", file=sys.stderr)
                sys.stderr.flush()
                with contextlib.suppress(
                    Exception
                ):  # a stderr without a file descriptor: the line above only
                    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                if self._on_hang is not None:
                    self._on_hang(idle, self._phase)
                self._exit(EXIT_HANG)
                return
