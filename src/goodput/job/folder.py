"""The launch folder: how a launch's workers tell ``goodput launch`` what happened.

``goodput launch`` makes one folder per launch (``<run_dir>/launches/<time>-<pid>/`` with ``--run-dir``, so it
stays in the run's history; a temporary one without) and exports it as ``$GOODPUT_LAUNCH_DIR``. Workers drop
small files there, and the launcher, which watches the folder while torchrun runs, acts on them:

    CRASH_LOOP        the crash-loop verdict (rank 0): stop torchrun, exit EXIT_CRASH_LOOP
    FATAL             "rank R: Type: message" of an error a restart cannot fix: stop, exit EXIT_FATAL
    NUMERIC           "rank R: line" of a numeric fault the ladder could not fix: stop, exit EXIT_NUMERIC
    PREEMPTED         JSON {step, url, run_dir} of the checkpoint saved after a preemption signal (rank 0)
    pids/rank-R       the pid of rank R's process, written once its preemption handler is installed
    logs/             torchrun's ``--log-dir`` (or the warm agent's, a folder a process): each worker's
                      ``error.json`` (torch's error-file mechanism; goodput's own name the global rank and
                      whether the error is a peer's reaction: a collective failing because another rank died)
                      and, unless ``--verbose``, its ``stdout.log``/``stderr.log`` and torchrun's (the agent's)
                      own output (see ``goodput.launch.output``)
    notices.log       one line per failure and what the warm agent did about it, for the terminal
    numeric.log       one line per numeric event the guard handled (rank 0), for the terminal even when the job
                      then stopped

The launch id (``$GOODPUT_LAUNCH_ID``) names the launch in crash-loop records and the ledger, so attempts of
earlier launches do not count against this one.

The workers' side writes (``install_error_report``, ``report_failure``, ``write_marker``), the launcher's side
reads (``read_marker``, ``last_error``); both tell a peer's reaction from a rank's own error the same way
(``is_peer_failure``, ``is_peer_failure_line``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any

from goodput._env import LAUNCH_DIR, LAUNCH_ID
from goodput.errors import (
    ConfigError,
    CrashLoop,
    FingerprintMismatch,
    NoValidCheckpoint,
    NumericFault,
    StateMismatch,
    StragglerStop,
)
from goodput.job.codes import EXIT_FATAL, EXIT_NUMERIC, EXIT_STRAGGLER, EXIT_USAGE

__all__ = [
    "FATAL_ERRORS",
    "FATAL_FILE",
    "LAUNCHES_DIR",
    "LAUNCH_DIR_ENV",
    "LAUNCH_ID_ENV",
    "NOTICES_FILE",
    "NUMERIC_FILE",
    "NUMERIC_NOTICES_FILE",
    "PEER_FAILURE_MARKERS",
    "PREEMPTED_FILE",
    "STRAGGLER_FILE",
    "failure_line",
    "install_error_report",
    "is_peer_failure",
    "is_peer_failure_line",
    "last_error",
    "launch_dir",
    "launch_id",
    "listen_for_failure",
    "new_launch_id",
    "read_marker",
    "register_pid",
    "report_failure",
    "write_marker",
    "write_notice",
]

LAUNCHES_DIR = "launches"  # <run_dir>/launches/<launch id>/: every launch of a run, in its history
LAUNCH_DIR_ENV = LAUNCH_DIR.name
LAUNCH_ID_ENV = LAUNCH_ID.name  # the ledger records the id in each attempt_start
FATAL_FILE = "FATAL"
NUMERIC_FILE = "NUMERIC"
STRAGGLER_FILE = "STRAGGLER"
PREEMPTED_FILE = "PREEMPTED"
PIDS_DIR = "pids"
LOGS_DIR = "logs"
NOTICES_FILE = "notices.log"
NUMERIC_NOTICES_FILE = "numeric.log"

# The stops with an exit code (and a launch marker) of their own; every other error a restart cannot fix is FATAL.
_STOP_CODES: dict[type[BaseException], int] = {NumericFault: EXIT_NUMERIC, StragglerStop: EXIT_STRAGGLER}
_STOP_FILES: dict[type[BaseException], str] = {NumericFault: NUMERIC_FILE, StragglerStop: STRAGGLER_FILE}

# Errors a restart cannot fix: the same configuration or the same checkpoint fails again in every attempt
# (AccessRefused, a ConfigError, among them: storage that refuses the credentials).
FATAL_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    StateMismatch,
    FingerprintMismatch,
    NoValidCheckpoint,
)

# Substrings of the errors a collective raises when a peer died or stopped answering (gloo, NCCL, c10d).
PEER_FAILURE_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out",
    "timed out",
    "Socket Timeout",
    "NCCL",
    "gloo",
    "ProcessGroup",
)


# Who else hears of the error that ends this process (``listen_for_failure``): one listener per process.
_failure_listener: Callable[[str, bool], None] | None = None


def launch_dir() -> str | None:
    """This process's launch folder (None when not started by ``goodput launch``)."""
    return LAUNCH_DIR.get() or None


def launch_id() -> str:
    """This launch's id: goodput launch's, else torchrun's run id (a fresh one per ``--standalone`` start)."""
    return LAUNCH_ID.get() or os.environ.get("TORCHELASTIC_RUN_ID", "")


def new_launch_id() -> str:
    """A new launch's id, which names its folder: the UTC time it began and a random tail, so that a run's
    launches sort by time."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"


def write_marker(name: str, content: str | dict[str, Any], *, exclusive: bool = False) -> bool:
    """Write ``name`` into the launch folder atomically; False when there is none (or, exclusive, it exists)."""
    folder = launch_dir()
    if folder is None:
        return False
    path = os.path.join(folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if exclusive and os.path.exists(path):
        return False
    text = content if isinstance(content, str) else json.dumps(content)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    if exclusive:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        return True
    os.replace(tmp, path)
    return True


def write_notice(text: str, *, name: str = NOTICES_FILE) -> None:
    """Append one line to ``name`` for the launcher to show on the terminal (nothing without a launch folder)."""
    folder = launch_dir()
    if folder is not None:
        with open(os.path.join(folder, name), "a") as f:
            f.write(text.replace("\n", " ") + "\n")


def read_marker(folder: str, name: str) -> str | None:
    """The text of a marker in ``folder`` (None when absent)."""
    try:
        with open(os.path.join(folder, name)) as f:
            return f.read().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def register_pid(rank: int) -> None:
    """Tell the launcher which process is ``rank`` (it forwards the preemption signal there)."""
    write_marker(os.path.join(PIDS_DIR, f"rank-{rank}"), str(os.getpid()))


def install_error_report(rank: int | Callable[[], int]) -> None:
    """Report this process's uncaught exception: to torch's error file (``$TORCHELASTIC_ERROR_FILE``, which
    torchrun and ``goodput launch`` read), and, for an error a restart cannot fix, as the launch's ``FATAL``.
    ``rank``: the rank to name, or a function giving the one this process holds when the error comes (a hot
    spare takes its rank after it started; a shrink or grow renumbers the ranks).

    goodput's own errors that a user acts on (``FATAL_ERRORS``, ``CrashLoop``) print one line, not a traceback;
    a peer's reaction to a rank that already stopped the launch (``FATAL``) prints nothing: the launcher quotes
    that rank, and the reaction's callstack stays in the error file.
    """
    previous = sys.excepthook

    def hook(kind: type[BaseException], err: BaseException, tb: TracebackType | None) -> None:
        now = rank() if callable(rank) else rank
        line = report_failure(now, err)
        if isinstance(err, (*FATAL_ERRORS, CrashLoop, NumericFault, StragglerStop)):
            if launch_dir() is None:  # under goodput launch, the launcher prints the one line
                # sys.__stderr__: torch's own excepthook (init_process_group's) captures sys.stderr around ours.
                print(f"goodput: rank {now}: {line}", file=sys.__stderr__ or sys.stderr, flush=True)
                code = _STOP_CODES.get(type(err), EXIT_FATAL)
                _exit_now(EXIT_USAGE if isinstance(err, ConfigError) else code)
            return
        if _reacts_to_fatal(err):
            return  # the launcher quotes the rank that failed; this callstack is in the error file
        previous(kind, err, tb)

    sys.excepthook = hook


def listen_for_failure(listener: Callable[[str, bool], None] | None) -> None:
    """Also tell ``listener(line, peer)`` the one line of the error that ends this process, and whether it is a
    peer's reaction (the run's crash-loop record: ``goodput.job.crashloop``); None: nobody."""
    global _failure_listener
    _failure_listener = listener


def failure_line(err: BaseException, *, line: str | None = None) -> str:
    """The one line that reports ``err``: ``Type: message``'s first line (the type alone for an empty
    message), or ``line`` when given."""
    if line is not None:
        return line
    name = type(err).__name__
    return f"{name}: {err}".splitlines()[0] if str(err) else name


def report_failure(rank: int, err: BaseException, *, line: str | None = None) -> str:
    """Report the error that ends this process (the excepthook's, or a warm-restart worker's own failure):
    to torch's error file and the failure listener, and, for an error a restart cannot fix, as the launch's
    ``FATAL``. Returns its one line (``Type: message``, or ``line`` when given)."""
    kind = type(err)
    line = failure_line(err, line=line)
    if not isinstance(err, CrashLoop):  # the verdict, not the cause: keep the cause as the last error
        peer = False
        with contextlib.suppress(Exception):
            peer = is_peer_failure(err)
            callstack = "".join(traceback.format_exception(kind, err, err.__traceback__))
            _record_error_file(line, callstack, rank, peer=peer)
        if _failure_listener is not None:
            with contextlib.suppress(Exception):
                _failure_listener(line, peer)
    if isinstance(err, (*FATAL_ERRORS, NumericFault, StragglerStop)):
        with contextlib.suppress(OSError):
            name = _STOP_FILES.get(type(err), FATAL_FILE)
            write_marker(name, f"rank {rank}: {line}", exclusive=True)
    return line


def _exit_now(code: int) -> None:
    """Exit with ``code`` from an excepthook (which cannot set the status): finish atexit work (the ledger's
    last flush) first."""
    atexit._run_exitfuncs()
    os._exit(code)


def _reacts_to_fatal(err: BaseException) -> bool:
    """Whether ``err`` is a peer's reaction to a rank that stopped the launch with an error no restart fixes."""
    folder = launch_dir()
    return folder is not None and read_marker(folder, FATAL_FILE) is not None and is_peer_failure(err)


def _record_error_file(message: str, callstack: str, rank: int, *, peer: bool) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):  # a script's own @record wrote it already
        return
    info = {
        "py_callstack": callstack,
        "timestamp": str(int(time.time())),
        "goodput_rank": str(rank),
        "goodput_peer_failure": "1" if peer else "0",
    }
    data = {"message": {"message": message, "extraInfo": info}}
    # Whole or absent: torchrun reads the file as soon as the process is gone, and a rank ended while writing
    # (its peer SIGKILLed, torchrun stopping the others) left an empty one that crashed torchrun's agent.
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def last_error(folder: str) -> str | None:
    """The error to quote for this launch from torch's error files: ``rank R: line``.

    A peer's reaction (a collective failing because another rank died: gloo's "Connection closed by peer") is
    never the root of a failure: the newest error that is not one is quoted, and only when every recorded error
    is such a reaction, the newest of those.
    """
    found: list[tuple[bool, float, str]] = []  # (a peer's reaction, when, "who: line")
    for root, _dirs, files in os.walk(os.path.join(folder, LOGS_DIR)):
        if "error.json" not in files:
            continue
        path = os.path.join(root, "error.json")
        try:
            with open(path) as f:
                message = json.load(f)["message"]
            stamp = os.path.getmtime(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        text = message["message"] if isinstance(message, dict) else str(message)
        extra = message.get("extraInfo") if isinstance(message, dict) else None
        extra = extra if isinstance(extra, dict) else {}
        # goodput's own error files name the global rank (a warm-restart agent starts every process as its
        # own local rank 0); torch's name the local rank by their folder.
        rank = extra.get("goodput_rank")
        who = f"rank {rank}" if rank is not None else f"local rank {os.path.basename(root)}"
        lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
        if lines:
            flag = extra.get("goodput_peer_failure")
            peer = flag == "1" if flag is not None else is_peer_failure_line(lines[0])
            found.append((peer, stamp, f"{who}: {lines[0]}"))
    if not found:
        return None
    roots = [e for e in found if not e[0]] or found
    return max(roots, key=lambda e: e[1])[2]


def is_peer_failure_line(line: str) -> bool:
    """Whether an error's one line (``Type: message``) reads like a peer's reaction (for error files that
    goodput did not write, which carry no flag)."""
    kind = line.split(":", 1)[0].rsplit(".", 1)[-1]
    if kind.startswith("Dist") and kind.endswith("Error"):  # torch.distributed's DistBackendError, ...
        return True
    return kind == "RuntimeError" and any(marker in line for marker in PEER_FAILURE_MARKERS)


def is_peer_failure(err: BaseException) -> bool:
    """Whether ``err`` (or its cause) looks like a collective failing because another rank failed.

    Such an error leaves this process healthy: it may restart warm. Anything else is this rank's own failure,
    and the process exits so the agent replaces it.
    """
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return False
        if _is_dist_error(seen):
            return True
        if isinstance(seen, RuntimeError) and any(m in str(seen) for m in PEER_FAILURE_MARKERS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _is_dist_error(err: BaseException) -> bool:
    """Whether ``err`` is torch.distributed's ``DistError``: only a process that imported torch.distributed can
    hold one, so this module need not import torch (the launcher never does)."""
    dist = sys.modules.get("torch.distributed")
    kind = getattr(dist, "DistError", None)
    return isinstance(kind, type) and isinstance(err, kind)
