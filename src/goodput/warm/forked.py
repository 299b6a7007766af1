"""How the warm agent makes its processes: forked from the node's template, else spawned.

A spawned process (torch.distributed.elastic's ``start_processes``, one context per slot) imports torch and the
script's imports itself: seconds of CPU. Workers and spares instead come from the node's template
(``goodput.warm.template``), started once before the first workers: each costs a fork. The agent becomes a
child subreaper so that it adopts every forked process; a :class:`ForkedProcess` gives it the part of elastic's
process context it uses (``wait``, ``close``, ``pids``), with the same results. A template that cannot start,
refuses to fork or dies is recorded in the agent's log, and processes are spawned as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from goodput.job.folder import LOGS_DIR, launch_dir
from goodput.job.signals import become_subreaper
from goodput.launch.launcher import LaunchConfig
from goodput.warm.idle import make_idle, make_normal
from goodput.warm.start import boot_args
from goodput.warm.template import READY

__all__ = ["ForkedProcess", "TemplateForks", "reap_adopted", "spawn"]

_REPLY_SECONDS = 10.0  # a ready template forks in milliseconds: a silent one this long is taken for dead


def _logs(launch: LaunchConfig, name: str) -> Any:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    # torch's error file of each process goes to the launch folder, where the launcher quotes the last one;
    # so do its stdout and stderr, which the launcher follows, unless --verbose (goodput.launch.output).
    folder = launch_dir()
    logs = os.path.join(folder, LOGS_DIR, name) if folder else os.devnull
    redirects = Std.NONE if launch.verbose or folder is None else Std.ALL
    return DefaultLogsSpecs(log_dir=logs, redirects=redirects)


def _streams(launch: LaunchConfig, name: str, env: dict[str, str]) -> tuple[str, str, str]:
    """(stdout, stderr, error file) of process ``name`` where elastic would put them ("": the agent's own);
    sets ``TORCHELASTIC_ERROR_FILE`` in ``env`` as elastic does."""
    dest = _logs(launch, name).reify({0: env})
    return dest.stdouts[0], dest.stderrs[0], dest.error_files[0]


def spawn(launch: LaunchConfig, name: str, env: dict[str, str], args: tuple[str, ...]) -> Any:
    """Start ``python -u ARGS`` as process ``name`` with elastic's ``start_processes``; its context."""
    from torch.distributed.elastic.multiprocessing import start_processes

    return start_processes(
        name=name,
        entrypoint=sys.executable,
        args={0: ("-u", *args)},
        envs={0: env},
        logs_specs=_logs(launch, name),
    )


class ForkedProcess:
    """A forked spare, adopted by the agent: waited for, ended and reported as elastic reports its processes."""

    def __init__(self, pid: int, error_file: str) -> None:
        self.pid = pid
        self.error_file = error_file
        self._result: Any = None

    def pids(self) -> dict[int, int]:
        return {0: self.pid}

    def wait(self, timeout: float = 0) -> Any:
        """None while it runs (after ``timeout`` seconds), else elastic's ``RunProcsResult`` of its exit."""
        deadline = time.monotonic() + timeout
        while self._result is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                pid, status = self.pid, -1
            if pid:
                self._result = _result(self.pid, status, self.error_file)
            elif time.monotonic() >= deadline:
                return None
            else:
                time.sleep(0.01)
        return self._result

    def close(self, death_sig: signal.Signals = signal.SIGTERM, timeout: float = 30) -> None:
        """Send ``death_sig``, and SIGKILL after ``timeout`` seconds if it still runs; reap it."""
        for sig, wait in ((death_sig, timeout), (signal.SIGKILL, _REPLY_SECONDS)):
            if self.wait(0) is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            self.wait(wait)


def _result(pid: int, status: int, error_file: str) -> Any:
    from torch.distributed.elastic.multiprocessing.api import ProcessFailure, RunProcsResult

    code = os.waitstatus_to_exitcode(status) if status >= 0 else -int(signal.SIGKILL)
    if code == 0:
        return RunProcsResult(return_values={0: None})
    return RunProcsResult(failures={0: ProcessFailure(0, pid, code, error_file)})


class TemplateForks:
    """The node's template, from the first workers or spares due to the agent's end: every process it forks.

    Args:
        launch: the job's launch.
        record: the agent's log (``WarmAgent.record``).
    """

    def __init__(self, launch: LaunchConfig, record: Callable[..., None]) -> None:
        self.launch = launch
        self._record = record
        self._proc: subprocess.Popen[bytes] | None = None
        self._requests = self._replies = -1
        self._ready = False
        self.off: str | None = None if os.path.isfile(launch.script[0]) else "the command is not a script"

    def settled(self, env: Callable[[], dict[str, str]], idle: bool) -> bool:
        """Whether spares can be made now (the template ready, or none to wait for); starts the template with
        the spare environment ``env()`` on the first call (under ``SCHED_IDLE`` if ``idle``)."""
        if self._proc is None and self.off is None:
            self._start(env(), idle)
        return self._check(0)

    def first(self, env: Callable[[], dict[str, str]], timeout: float) -> bool:
        """Start the template now, at the normal policy, and wait up to ``timeout`` seconds for it: the node's
        first workers are forked from it, so the node imports once, and the spares that follow cost a fork
        each with no import beside the training ranks. Whether it is ready."""
        return self.settled(env, False) or self.finish(timeout)

    def finish(self, timeout: float) -> bool:
        """Whether a template is ready, waiting up to ``timeout`` seconds for one still importing, which
        finishes at the normal policy (as a spawned spare handed a rank does)."""
        if self._proc is None or self._ready or self.off is not None:
            return self._ready
        make_normal(self._proc.pid)
        self._check(timeout)
        return self._ready

    def _check(self, timeout: float) -> bool:
        """Read the template's first line if it comes within ``timeout`` seconds; whether spares can be made."""
        if self.off is None and not self._ready and select.select([self._replies], [], [], timeout)[0]:
            line = _readline(self._replies)
            self._ready = line.startswith(READY)
            if not self._ready:
                self._fail(line or "it ended while importing")
        return self._ready or self.off is not None

    def _start(self, env: dict[str, str], idle: bool) -> None:
        if not become_subreaper():
            self.off = "the agent cannot adopt forked spares (no PR_SET_CHILD_SUBREAPER)"
            self._record("template_failed", reason=self.off)
            return
        requests, self._requests = os.pipe()
        self._replies, replies = os.pipe()
        out, err, _ = _streams(self.launch, "template", env)
        with contextlib.ExitStack() as files:
            stdout, stderr = (files.enter_context(open(p, "w")) if p else None for p in (out, err))
            args = [str(requests), str(replies), str(os.getpid()), *self.launch.script]
            self._proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "goodput.warm.template", *args],
                env=env,
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                pass_fds=(requests, replies),
                start_new_session=True,
            )
        os.close(requests)
        os.close(replies)
        if idle:
            make_idle(self._proc.pid)  # its imports use only CPU time the ranks leave; its forks inherit it

    def start(self, name: str, env: dict[str, str], *, idle: bool, policy: bool) -> tuple[Any, int]:
        """Process ``name`` forked from the template, else spawned: (its process context, pid). With ``policy``
        (the agent may set it), a forked one runs its short rest of a start at the normal policy (the template
        may run under SCHED_IDLE), and a spawned one under SCHED_IDLE if ``idle`` (a spare: its imports use
        only CPU time the ranks leave, goodput.warm.idle)."""
        ctx: Any = self.fork(name, env)
        if ctx is None:
            ctx = spawn(self.launch, name, env, boot_args(self.launch.script))
        pid = ctx.pids()[0]
        if policy:
            (make_idle if idle and not isinstance(ctx, ForkedProcess) else make_normal)(pid)
        return ctx, pid

    def fork(self, name: str, env: dict[str, str]) -> ForkedProcess | None:
        """A process (a worker or a spare) forked from the template, named ``name`` with environment ``env``;
        None when no template is ready (then spawn it)."""
        if not self._ready or self.off is not None:
            return None
        assert self._proc is not None
        if self._proc.poll() is not None:
            self._fail(f"it ended (exit code {self._proc.returncode})")
            return None
        out, err, error_file = _streams(self.launch, name, env)
        request = json.dumps({"env": env, "stdout": out, "stderr": err}) + "\n"
        try:
            os.write(self._requests, request.encode())
        except OSError:
            self._fail("it ended")
            return None
        ready = select.select([self._replies], [], [], _REPLY_SECONDS)[0]
        answer = _readline(self._replies) if ready else ""
        if not answer.strip().isdigit() or int(answer) <= 0:
            self._fail(f"no spare forked ({answer.strip() or 'no answer'})")
            return None
        return ForkedProcess(int(answer), error_file)

    def _fail(self, reason: str) -> None:
        self.off = f"the spare template failed: {reason}; spares are spawned"
        self._record("template_failed", reason=self.off)
        self.close()

    def pid(self) -> int | None:
        """The template's pid, while it runs."""
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        """End the template (the spares it forked are the agent's: they stay)."""
        for fd in (self._requests, self._replies):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._requests = self._replies = -1
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            self._proc.wait()
        self._ready = False


def _readline(fd: int) -> str:
    """One line from pipe ``fd`` (its writer writes whole lines at once); "" at its end."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def reap_adopted(known: Iterable[int]) -> None:
    """Reap the ended processes the agent adopted as a subreaper that are none of its own (``known``): e.g. a
    failed worker's data-loader processes, re-parented to the agent when their worker died."""
    own = set(known)
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid in own:  # one of the agent's own ended: its owner reaps it
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)
