"""The launcher's supervision of one torchrun: its launch folder, signals, verdicts, and the final line.

``Supervisor.run`` starts torchrun (or, under ``--restart warm``, the warm-restart agent of
``goodput.warm.agent``, which takes torchrun's place) in a session of its own and polls it (every 0.1 s) until it
exits, acting on what the workers report in the launch folder (see ``goodput.job.folder``) and on signals:

* ``CRASH_LOOP`` or ``FATAL``: end the job at once, print the verdict and the failing rank's last error, and
  return ``EXIT_CRASH_LOOP`` or ``EXIT_FATAL``;
* the first SIGTERM, SIGINT or preemption signal: forward the preemption signal to every rank, give the job
  ``grace`` seconds to save, then print where it saved and return ``EXIT_PREEMPTED`` (or, with no save in time,
  end everything and return 128 + the signal); a second signal ends everything at once.

Ending the job: torchrun is frozen first (so it neither restarts workers nor prints a traceback), then every
other process of the job gets SIGTERM and, after a few seconds, SIGKILL; then torchrun is killed. The launcher
is a child subreaper, so workers whose torchrun died are still its descendants; it remembers the job's processes (torchrun's
descendants, read every poll) and ends only those, so several launches in one process (tests) stay apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from typing import IO, Any

from goodput._env import ALLOW_FRESH_START, CRASH_LOOP, FAULTS, RESERVED_WORLD, RUN_DIR
from goodput._lifetime import end_with_parent, pid_running, preload_libc
from goodput.job.codes import EXIT_CRASH_LOOP, EXIT_FATAL, EXIT_NUMERIC, EXIT_PREEMPTED, EXIT_STRAGGLER
from goodput.job.crashloop import CRASH_LOOP_FILE
from goodput.job.folder import (
    FATAL_FILE,
    LAUNCH_DIR_ENV,
    LAUNCH_ID_ENV,
    LAUNCHES_DIR,
    LOGS_DIR,
    NUMERIC_FILE,
    PIDS_DIR,
    PREEMPTED_FILE,
    STRAGGLER_FILE,
    last_error,
    new_launch_id,
    read_marker,
)
from goodput.job.signals import (
    LAUNCHER_PID_ENV,
    PREEMPT_SIGNAL_ENV,
    become_subreaper,
    descendants,
    parse_signal,
)
from goodput.launch.launcher import LaunchConfig, torchrun_command
from goodput.launch.output import AGENT_LOG, TORCHRUN_LOG, Terminal
from goodput.launch.rendezvous import AGENT_ERROR_FILE, ERROR_FILE_ENV, rendezvous_lost
from goodput.launch.scratch import job_temp_env, make_job_temp, remove_job_temp

__all__ = ["Supervisor"]

_POLL = 0.1
_RANK_FILE = re.compile(r"rank-\d+")  # a rank's pid marker; rank-N.PID.tmp is one being written
_TERM_WAIT = 5.0  # seconds between SIGTERM and SIGKILL when ending leftovers
_AFTER_SAVE = 15.0  # seconds the workers get to exit once the preemption checkpoint is durable


class Supervisor:
    """Runs and watches one torchrun for a :class:`LaunchConfig`.

    Args:
        config: the launch.
        command: the command to run and watch instead of torchrun (the warm-restart agent's); it finds the
            launch folder in ``$GOODPUT_LAUNCH_DIR`` like every worker.
    """

    def __init__(self, config: LaunchConfig, command: list[str] | None = None) -> None:
        self.config = config
        self.command = command
        self.preempt_signal = parse_signal(config.preempt_signal)
        self._signals: list[int] = []
        self._forwarded: set[tuple[str, int]] = set()
        self._family: set[int] = set()  # every process of this job seen so far (torchrun's descendants)
        self.folder = ""
        self.scratch = ""  # the job's temporary folder (goodput.launch.scratch)
        self._terminal: Terminal | None = None

    def run(self) -> int:
        """Launch, supervise and clean up; returns the launch's exit status."""
        temporary = self._make_folder()
        self.scratch = make_job_temp(os.path.basename(self.folder))
        become_subreaper()
        caught = (signal.SIGTERM, signal.SIGINT, self.preempt_signal)
        # Signals reach the main thread only; a launch run from another thread (tests) does without them.
        main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in caught} if main else {}
        proc: subprocess.Popen[bytes] | None = None
        status: int | None = None
        try:
            log_dir = os.path.join(self.folder, LOGS_DIR)
            command = self.command or torchrun_command(self.config, log_dir=log_dir)
            launcher = os.getpid()
            preload_libc()  # the child between fork and exec only calls into it
            with self._own_output(log_dir) as output:
                proc = subprocess.Popen(
                    command,
                    env=self._env(),
                    start_new_session=True,
                    stdout=output,
                    stderr=output,
                    preexec_fn=lambda: end_with_parent(
                        launcher
                    ),  # a SIGKILLed launcher takes torchrun with it
                )
            status = self._supervise(proc)
            return status
        finally:
            self._end_job(proc)
            remove_job_temp(self.scratch)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if temporary and (status == 0 or self.config.verbose):  # a failed job's logs stay to be read
                shutil.rmtree(self.folder, ignore_errors=True)
            self._pass_on(previous)

    def _pass_on(self, previous: Mapping[signal.Signals, Any]) -> None:
        """Each signal caught goes on, now that the job has ended, to the handler it replaced where that is the
        program's own: a program running launches in its process (verify-resume) hears that it was asked to
        stop. Python's default SIGINT handler is left out (KeyboardInterrupt would undo the verdict)."""
        for signum in self._signals:
            handler = previous.get(signal.Signals(signum))
            if callable(handler) and handler is not signal.default_int_handler:
                handler(signum, None)

    @contextlib.contextmanager
    def _own_output(self, log_dir: str) -> Iterator[IO[bytes] | None]:
        """Where torchrun's (the warm agent's) own output goes: its log file, or the terminal with --verbose."""
        if self.config.verbose:
            yield None
            return
        os.makedirs(log_dir, exist_ok=True)
        with open(os.path.join(log_dir, AGENT_LOG if self.command else TORCHRUN_LOG), "ab") as f:
            yield f

    # ---- set-up ---------------------------------------------------------------------------------------------
    def _make_folder(self) -> bool:
        """The launch folder: in the run's history with --run-dir, else a temporary one. True if temporary."""
        launch = new_launch_id()
        if self.config.run_dir is None:
            self.folder = tempfile.mkdtemp(prefix=f"goodput-launch-{launch}-")
            return True
        self.folder = os.path.abspath(os.path.join(self.config.run_dir, LAUNCHES_DIR, launch))
        os.makedirs(self.folder)
        return False

    @property
    def terminal(self) -> Terminal:
        """What the terminal shows of the job (see ``goodput.launch.output``)."""
        if self._terminal is None:
            c = self.config
            self._terminal = Terminal(
                self.folder, verbose=c.verbose, max_restarts=c.max_restarts, warm=self.command is not None
            )
        return self._terminal

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.config.run_dir is not None:
            env[RUN_DIR.name] = os.path.abspath(self.config.run_dir)
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        env[FAULTS.name] = self.config.faults
        env[CRASH_LOOP.name] = str(self.config.crash_loop)
        env[RESERVED_WORLD.name] = str(self.config.max_world_size)  # capacity goodput's denominator
        if self.config.allow_fresh_start:
            env[ALLOW_FRESH_START.name] = "1"  # read by CheckpointConfig.fresh_start_allowed
        env[LAUNCH_DIR_ENV] = self.folder
        env[LAUNCH_ID_ENV] = os.path.basename(self.folder)
        env[PREEMPT_SIGNAL_ENV] = self.preempt_signal.name
        env[LAUNCHER_PID_ENV] = str(os.getpid())
        env.update(job_temp_env(self.scratch))
        # the agent's own uncaught error, torchrun's or the warm agent's (their workers get files of their own)
        env[ERROR_FILE_ENV] = os.path.join(self.folder, AGENT_ERROR_FILE)
        return env

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)

    # ---- the watch ------------------------------------------------------------------------------------------
    def _supervise(self, proc: subprocess.Popen[bytes]) -> int:
        deadline: float | None = None
        while True:
            # Learn the job's processes while torchrun is alive: once it dies they are orphans, re-parented to
            # this (subreaper) process, and only this list tells them from other children of the process.
            self._family.update(descendants(proc.pid))
            with contextlib.suppress(subprocess.TimeoutExpired):
                status = proc.wait(timeout=_POLL)
                return self._verdict(status)
            if len(self._signals) >= 2:
                self._end_job(proc)
                self.terminal.drain(events=False)
                self._say(
                    f"stopped at once by a second {_name(self._signals[1])}; steps since the last "
                    "checkpoint are lost"
                )
                return 128 + self._signals[1]
            if self._signals:
                deadline = deadline or time.monotonic() + self.config.grace
                self._forward()
                if read_marker(self.folder, PREEMPTED_FILE) is not None:
                    deadline = min(deadline, time.monotonic() + _AFTER_SAVE)
                if time.monotonic() > deadline:
                    self._end_job(proc)
                    return self._verdict(None)
            for name in (FATAL_FILE, CRASH_LOOP_FILE, NUMERIC_FILE, STRAGGLER_FILE):
                if read_marker(self.folder, name) is not None:
                    self._end_job(proc)
                    return self._verdict(None)
            self.terminal.poll()

    def _forward(self) -> None:
        """Send the preemption signal to every rank's process that has not had it (new ranks included)."""
        mine = set(descendants(os.getpid()))
        try:
            names = os.listdir(os.path.join(self.folder, PIDS_DIR))
        except FileNotFoundError:
            return
        for name in names:
            text = read_marker(os.path.join(self.folder, PIDS_DIR), name)
            if not _RANK_FILE.fullmatch(name) or text is None or not text.isdigit():
                continue  # a marker still being written (rank-N.PID.tmp)
            if (name, int(text)) in self._forwarded:
                continue
            pid = int(text)
            if pid in mine:  # never a stale pid that now names someone else's process
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, self.preempt_signal)
                self._forwarded.add((name, pid))

    def _verdict(self, status: int | None) -> int:
        """The exit status and the one line for how the job ended (status None: the launcher ended it)."""
        # The rest of the workers' output first; failure lines only when the job ended by itself (else the
        # verdict below says what happened).
        self.terminal.drain(events=status is not None)
        saved = read_marker(self.folder, PREEMPTED_FILE)
        if saved is not None:
            self._say(_preempted_line(saved, self._signals))
            return EXIT_PREEMPTED
        for marker, code in ((NUMERIC_FILE, EXIT_NUMERIC), (STRAGGLER_FILE, EXIT_STRAGGLER)):
            reason = read_marker(self.folder, marker)
            if reason is not None:
                self._say(f"stopped: {reason}")
                return code
        fatal = read_marker(self.folder, FATAL_FILE)
        if fatal is not None:
            self._say(f"stopped: {fatal}; a restart cannot fix this: fix it, then relaunch")
            return EXIT_FATAL
        loop = read_marker(self.folder, CRASH_LOOP_FILE)
        if loop is not None:
            error = last_error(self.folder)
            cause = f"; last error ({error})" if error else f"; see the logs in {self._logs()}"
            if error and error in loop:  # the verdict quotes it already (the same error every time)
                cause = ""
            self._say(f"crash loop: {loop}{cause}; fix it, then relaunch (a new launch starts a new count)")
            return EXIT_CRASH_LOOP
        lost = self._rendezvous_lost(status)
        if lost is not None:
            self._say(lost)
            return EXIT_PREEMPTED
        if self._signals and status == 0:
            # Every rank ended by itself, successfully, before they agreed on a stop: the job is done and
            # nothing is lost, so a scheduler must not requeue it.
            self._say(f"{_name(self._signals[0])} came as the job completed: nothing left to save or run")
            return 0
        if self._signals:
            why = "no checkpoint within the grace period" if status is None else "the job ended before saving"
            self._say(f"stopped by {_name(self._signals[0])}: {why}; the newest committed checkpoint stays")
            return 128 + self._signals[0]
        assert status is not None
        if status != 0 and not self.config.verbose:
            self._say(f"the job failed (exit status {status}); full logs in {self._logs()}")
        return status

    def _rendezvous_lost(self, status: int | None) -> str | None:
        """Why torchrun ended, when it ended by itself because its rendezvous lost a node (else None)."""
        c = self.config
        if status in (0, None) or self._signals or c.rdzv_endpoint is None:
            return None
        return rendezvous_lost(self.folder, endpoint=c.rdzv_endpoint, timeout=c.rdzv_timeout)

    def _logs(self) -> str:
        return os.path.join(self.folder, LOGS_DIR) if not self.config.verbose else "the output above"

    def _end_job(self, proc: subprocess.Popen[bytes] | None) -> None:
        """Freeze torchrun, end every other process of the job (SIGTERM, then SIGKILL), then kill torchrun.

        Frozen (SIGSTOP), torchrun restarts no worker, and the warm agent's store, which its workers wait on,
        stays open: a worker sees no closed connection (and prints no traceback) before its SIGTERM."""
        if proc is not None and proc.poll() is None:
            self._family.update(descendants(proc.pid))
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGSTOP)
        try:
            self._end_family()
        finally:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
                self._alive()  # reap its dead children, now re-parented to this process

    def _end_family(self) -> None:
        left = self._alive()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            end = time.monotonic() + _TERM_WAIT
            while left and time.monotonic() < end:
                time.sleep(_POLL)
                left = self._alive()
            if not left:
                return

    def _alive(self) -> list[int]:
        """The job's processes still alive (reaping those re-parented to this process)."""
        mine = descendants(os.getpid())
        # a list first: adding to the set while a generator still walks it raises (new children were found)
        self._family.update([p for q in self._family if q in mine for p in descendants(q)])
        alive = []
        for pid in sorted(self._family):
            if pid not in mine:  # gone, or a reused pid that is no longer ours
                continue
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    continue  # an orphan of the job that just ended: reaped
            if pid_running(pid):  # (a dead child of the frozen torchrun is reaped once torchrun is killed)
                alive.append(pid)
        return alive

    def _say(self, text: str) -> None:
        print(f"goodput launch: {text}", file=sys.stderr, flush=True)


def _name(signum: int) -> str:
    return signal.Signals(signum).name


def _preempted_line(saved: str, signals: list[int]) -> str:
    try:
        info = json.loads(saved)
    except ValueError:
        info = {}
    why = _name(signals[0]) if signals else str(info.get("signal", "a signal"))
    where = info.get("url") or "the run's checkpoints"
    run_dir = info.get("run_dir")
    again = f"goodput launch ... --run-dir {run_dir}" if run_dir else "the same goodput launch command"
    return (
        f"preempted by {why}: saved step {info.get('step', '?')} to {where}; "
        f"resume with {again} (exit {EXIT_PREEMPTED})"
    )
