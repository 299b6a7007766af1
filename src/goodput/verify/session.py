"""The lifetime of a command that runs a user's script several times (drill, verify-resume, verify-rollback):
no process and no temporary folder of it outlives it.

:func:`in_work_folder` runs the command in its work folder: the user's ``--work-dir`` (kept), or a new temporary
folder, removed when the command ends, however it ends, unless the user asked to keep it. Meanwhile SIGTERM and
SIGINT stop the command as they stop ``goodput launch``: each is passed on to the launches it runs as processes
(:func:`started`), whose ranks then save and stop within the launch's grace (a second signal: at once); a launch
run in this process catches them itself and passes them on once its job has ended (``goodput.launch.supervise``).
The command goes on only until its running launch has ended: :func:`raise_if_stopped`, called after each launch
and before the next, raises :class:`~goodput.errors.Stopped`, and the command line exits 128 + the signal.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

from goodput.errors import Stopped

__all__ = ["in_work_folder", "raise_if_stopped", "started"]

_CAUGHT = (signal.SIGTERM, signal.SIGINT)
_STOP_WAIT = 120.0  # seconds a launch may take to end once signalled (its grace, 60 s by default, and more)

# Process-wide, as signal handlers are: the launches this process started and still runs, the signals it caught.
_launches: list[subprocess.Popen[bytes]] = []
_signals: list[int] = []


def in_work_folder(
    run: Callable[[str], int], work_dir: str | None, *, prefix: str, keep: bool, say: Callable[[str], None]
) -> int:
    """``run(work)`` in the work folder ``work_dir``, or in a new temporary one (its name starts with ``prefix``)
    removed afterwards unless ``keep``; returns what ``run`` returns.

    Raises:
        Stopped: SIGTERM or SIGINT came meanwhile; every launch started has ended and the folder is removed.
    """
    work = work_dir or tempfile.mkdtemp(prefix=prefix)
    removed = work_dir is None and not keep
    try:
        with _stopping():
            try:
                status = run(work)
                raise_if_stopped()
            finally:
                _end_launches()  # a second signal, meanwhile, is passed on too
    finally:
        if removed:
            shutil.rmtree(work, ignore_errors=True)
    if status != 0 and removed:
        say(
            f"(the runs' temporary folder {work} is removed: add --keep or --work-dir DIR to read their output)"
        )
    return status


def started(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """Record a launch this process started: a signal is passed on to it, and the command waits for its end.
    Returns ``proc``."""
    _launches[:] = [p for p in _launches if p.poll() is None] + [proc]
    if _signals:  # came as it started
        proc.send_signal(_signals[0])
    return proc


def raise_if_stopped() -> None:
    """Raise :class:`~goodput.errors.Stopped` once SIGTERM or SIGINT came (call it where a launch ended)."""
    if _signals:
        raise Stopped(_signals[0])


@contextlib.contextmanager
def _stopping() -> Iterator[None]:
    """SIGTERM and SIGINT recorded and passed on to the running launches meanwhile (signals reach the main
    thread only: elsewhere, as in a test that runs a command in a thread, they keep their handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _signals.clear()
    previous = {sig: signal.signal(sig, _on_signal) for sig in _CAUGHT}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _on_signal(signum: int, frame: Any) -> None:
    _signals.append(signum)
    for proc in _launches:
        proc.send_signal(signum)  # a no-op for one that has ended (Popen checks)


def _end_launches() -> None:
    """Wait for every launch started to end; one not signalled yet (the command failed) gets SIGTERM first, one
    that does not end in time (a stopped launcher), SIGKILL: its job ends with it (``goodput._lifetime``)."""
    for proc in _launches:
        if proc.poll() is None and not _signals:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=_STOP_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _launches.clear()
