"""What ``goodput launch`` shows on the terminal, and the full logs it keeps in the launch folder.

A failure under torchrun prints torchrun's ``failed (exitcode: -9)`` block and the survivors' tracebacks of
their broken collectives; a script that raises prints its traceback once per rank and attempt. By default
(quiet) the terminal gets instead:

* what the workers print to stdout (the user's prints, progress lines), as they print it;
* what they print to stderr (the user's logging, warnings) without Python tracebacks, and without the
  checkpoint-by-checkpoint detail of a numeric rollback (the guard's notice says it in one line);
* one line per numeric event (what the guard found, the step it rolled back to, the data it skipped);
* one line per failure: what failed (rank, signal or exit status and the exception's last line) and what was
  done (torchrun restarts the job, a warm hand-over, a cold restart, no restarts left);
* the launcher's final line, which names the cause of a failed job.

Everything goes to files under the launch folder's ``logs/``: torchrun's own output in ``torchrun.log`` (the
warm agent's in ``agent.log``), and every worker's ``stdout.log`` and ``stderr.log`` in torch's layout
(``<run id>_<random>/attempt_<n>/<local rank>/``; under the warm agent one such tree per process, in
``logs/rank<r>/`` or ``logs/spare<k>/``), written by torchrun's ``--redirects`` (the agent's
``start_processes``) and followed here. The workers therefore write to files, not to a terminal: goodput's own
progress line becomes a plain line now and then. ``--verbose`` leaves everything on the terminal as torchrun
prints it and redirects nothing.

For cold restarts the failure lines come from torchrun's log (its ``failed (exitcode: ...)`` record) and the
workers' error files; the warm agent, which decides itself, writes its own lines to the launch folder's
``notices.log`` (``goodput.job.folder.write_notice``); the numeric guard's rank 0 writes one line per event to
``numeric.log``, shown even when the job then stops (the verdict line comes last).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import sys
from typing import IO

from goodput.job.crashloop import CRASH_LOOP_FILE
from goodput.job.folder import (
    FATAL_FILE,
    LOGS_DIR,
    NOTICES_FILE,
    NUMERIC_FILE,
    NUMERIC_NOTICES_FILE,
    PIDS_DIR,
    read_marker,
)

__all__ = ["AGENT_LOG", "TORCHRUN_LOG", "Terminal", "TracebackFilter", "describe_exit"]

TORCHRUN_LOG = "torchrun.log"
AGENT_LOG = "agent.log"
_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]: ?")  # torch's per-rank prefix of a worker's traceback lines
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_ENDING = (FATAL_FILE, CRASH_LOOP_FILE, NUMERIC_FILE)  # markers of a job the launcher is ending
# The rollback's detail that goodput.checkpoint logs per checkpoint (rank 0): kept in stderr.log only.
_ROLLBACK_DETAIL = re.compile(r"^rollback: (discarding checkpoint|could not delete) ")
_CHAINS = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


class TracebackFilter:
    """Drops Python tracebacks (and C++ frames quoted in an exception) from a stream of lines, keeps the rest.

    A traceback starts at ``Traceback (most recent call last):`` (or a faulthandler's ``... (most recent call
    first):``); its indented frame lines follow, then the exception's line; chained exceptions and the C++
    frames torch quotes in a message continue it. The first other line ends it.
    """

    def __init__(self) -> None:
        self._state = "text"  # "frames": inside the frame list; "tail": after the exception's line

    def keep(self, line: str) -> bool:
        """Whether ``line`` (without its newline) is shown."""
        body = _PREFIX.sub("", line, count=1)
        stripped = body.strip()
        if stripped.endswith(("(most recent call last):", "(most recent call first):")):
            self._state = "frames"
            return False
        if self._state == "frames":
            if body[:1].isspace() or not stripped:
                return False
            self._state = "tail"  # the exception's own line
            return False
        if self._state == "tail":
            if not stripped or stripped in _CHAINS or _quoted_frame(stripped):
                return False
            self._state = "text"
        return not stripped.startswith("Exception in thread ")  # the heading of a thread's traceback


def _shown(tracebacks: TracebackFilter, line: str) -> bool:
    """Whether a worker's stderr ``line`` goes to the terminal: not in a traceback, not a rollback's detail."""
    return tracebacks.keep(line) and not _ROLLBACK_DETAIL.match(_PREFIX.sub("", line, count=1))


def _quoted_frame(text: str) -> bool:
    return text.startswith(("frame #", "Exception raised from ")) or (
        text.startswith("[rank") and "frame #" in text
    )


class _Tail:
    """A file followed from where it was last read; yields whole lines (a last partial one when told)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def lines(self, *, final: bool = False) -> list[str]:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return []
        if (
            size < self._offset
        ):  # written anew (torchrun reuses an attempt's folder after a membership change)
            self._offset, self._partial = 0, b""
        data = b""
        if size > self._offset:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(size - self._offset)
            self._offset += len(data)
        text = self._partial + data
        *whole, self._partial = text.split(b"\n")
        if final and self._partial:
            whole.append(self._partial)
            self._partial = b""
        return [part.decode(errors="replace") for part in whole]


class Terminal:
    """Echoes a launch's logs to the terminal (see the module docstring); the supervisor calls ``poll``.

    Args:
        folder: the launch folder.
        verbose: everything is on the terminal already: only the notices (warm agent, numeric guard) are echoed.
        max_restarts: torchrun's restart budget (for the cold failure lines).
        warm: the job runs under the warm agent, which writes its own failure lines.
    """

    def __init__(self, folder: str, *, verbose: bool, max_restarts: int, warm: bool) -> None:
        self.folder = folder
        self.logs = os.path.join(folder, LOGS_DIR)
        self.verbose = verbose
        self.max_restarts = max_restarts
        self.warm = warm
        self._tails: dict[str, tuple[_Tail, TracebackFilter | None]] = {}
        self._notices = _Tail(os.path.join(folder, NOTICES_FILE))
        self._numeric = _Tail(os.path.join(folder, NUMERIC_NOTICES_FILE))
        self._torchrun = _Tail(os.path.join(self.logs, TORCHRUN_LOG))
        self._failures = 0
        self._ranks: dict[int, int] = {}  # pid -> global rank, from the launch folder's pids/

    def poll(self, *, events: bool = True, final: bool = False) -> None:
        """Echo what was written since the last call; ``events``: also the failure lines."""
        if not self.verbose:
            self._echo_workers(final)
        for line in self._numeric.lines(final=final):  # what happened before any verdict: always shown
            self._say(line)
        # A fatal error, a crash loop or a numeric stop ends the job: the launcher's verdict, not a restart line
        # (a peer failing in its collective once the stopping rank let go), says so.
        if events and not any(read_marker(self.folder, name) for name in _ENDING):
            if not self.warm and not self.verbose:
                self._learn_ranks()
                for line in self._torchrun.lines(final=final):
                    failed = _FAILED.search(line)
                    if failed:
                        self._say(self._cold_failure(*(int(g) for g in failed.groups())))
            for line in self._notices.lines(final=final):
                if line.strip():
                    self._say(line.strip())

    def drain(self, *, events: bool) -> None:
        """The job has ended: echo the rest (``events``: the failure lines too, when the job ended by itself)."""
        self.poll(events=events, final=True)

    def _echo_workers(self, final: bool) -> None:
        for root, _dirs, files in sorted(os.walk(self.logs)):
            for name in ("stdout.log", "stderr.log"):
                if name in files:
                    path = os.path.join(root, name)
                    if path not in self._tails:
                        self._tails[path] = (_Tail(path), TracebackFilter() if name == "stderr.log" else None)
        for tail, keep in self._tails.values():
            stream = sys.stdout if keep is None else sys.stderr
            shown = [line for line in tail.lines(final=final) if keep is None or _shown(keep, line)]
            _write(stream, shown)

    def _learn_ranks(self) -> None:
        folder = os.path.join(self.folder, PIDS_DIR)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return
        for name in names:
            text = read_marker(folder, name)
            rank = name.removeprefix("rank-")
            if (
                name.startswith("rank-") and rank.isdigit() and text and text.isdigit()
            ):  # not a .tmp being written
                self._ranks[int(text)] = int(rank)

    def _cold_failure(self, exitcode: int, local_rank: int, pid: int) -> str:
        attempt = self._failures
        self._failures += 1
        rank = self._ranks.get(pid)
        who = f"rank {rank}" if rank is not None else f"local rank {local_rank}"
        found = sorted(
            glob.glob(os.path.join(self.logs, "*", f"attempt_{attempt}", str(local_rank), "error.json"))
        )
        what = describe_exit(exitcode, found[-1] if found else None)
        if self._failures <= self.max_restarts:
            done = f"torchrun restarts the job (restart {self._failures} of {self.max_restarts})"
        else:
            done = f"no restarts left (--max-restarts {self.max_restarts}): the job stops"
        return f"{who} {what}; {done}"

    def _say(self, text: str) -> None:
        _write(sys.stderr, [f"goodput launch: {text}"])


def _write(stream: IO[str], lines: list[str]) -> None:
    if lines:
        stream.write("".join(f"{line}\n" for line in lines))
        stream.flush()


def describe_exit(exitcode: int, error_file: str | None) -> str:
    """How a worker ended, in a few words: ``killed by SIGKILL``, ``exited with status 1 (ValueError: ...)``."""
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    error = _error_line(error_file) if error_file else None
    return f"exited with status {exitcode}" + (f" ({error})" if error else "")


def _error_line(path: str) -> str | None:
    """The first line of the error a worker recorded in torch's error file (None: none there)."""
    try:
        with open(path) as f:
            message = json.load(f)["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    text = message.get("message") if isinstance(message, dict) else message
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return lines[0] if lines else None
