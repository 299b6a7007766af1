"""Helpers for tests that run `goodput launch` as a real process and signal it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from goodput.checkpoint import list_checkpoints
from goodput.drill.runs import processes_of
from goodput.job.codes import EXIT_PREEMPTED
from tests.helpers import paths

SCRIPTS = str(paths.SCRIPTS)
WORKER = os.path.join(SCRIPTS, "run_worker.py")


def start_launch(*args: str) -> subprocess.Popen[str]:
    """`goodput launch ARGS` in the background (stdout and stderr captured)."""
    return subprocess.Popen(
        [sys.executable, "-m", "goodput", "launch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def warm_launch(run_dir: str, nproc: int = 2) -> list[str]:
    """The command line of `goodput launch --restart warm --nproc NPROC --run-dir RUN_DIR`, to extend."""
    return [
        sys.executable,
        "-m",
        "goodput",
        "launch",
        "--restart",
        "warm",
        "--nproc",
        str(nproc),
        "--run-dir",
        run_dir,
    ]


def start_training(run_dir: str, *args: str) -> subprocess.Popen[str]:
    """`goodput launch --run-dir RUN_DIR ARGS` in the background, once its workers train (they write
    RUN_DIR/training, as tests/scripts/run_worker.py does)."""
    proc = start_launch("--run-dir", run_dir, *args)
    wait_for_file(os.path.join(run_dir, "training"), proc)
    return proc


def wait_for_file(path: str, proc: subprocess.Popen[str], timeout: float = 180.0) -> None:
    """Wait until ``path`` exists (the workers write it once they train); fail if ``proc`` ends first."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(
                f"launch ended ({proc.returncode}) before {path}: {proc.stderr.read()[-3000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path} after {timeout}s")
        time.sleep(0.1)  # polling for a condition, not a synchronisation by time


def processes_with(run_dir: str) -> list[int]:
    """Live processes whose environment names ``run_dir`` as GOODPUT_RUN_DIR (the job's processes)."""
    return processes_of(run_dir)


def launch_lines(stderr: str) -> list[str]:
    """The launcher's own lines in its stderr."""
    return [line for line in stderr.splitlines() if line.startswith("goodput launch:")]


_PY_WARNING = re.compile(
    r"^\S+:\d+: \w*Warning: "
)  # warnings.showwarning's first line: file:line: Kind: text


def terminal_lines(output: str) -> list[str]:
    """The non-empty lines a user reads on the launch terminal, less the Python warnings that packages of the
    environment print when imported (``file:line: FutureWarning: ...`` and the source line under it)."""
    lines: list[str] = []
    warned = False
    for line in output.splitlines():
        if _PY_WARNING.match(line):
            warned = True
        elif not (warned and line[:1].isspace()) and line.strip():
            lines.append(line)
            warned = False
    return lines


def sigterm_saves_once(proc: subprocess.Popen[str], run_dir: str) -> int:
    """SIGTERM the launcher alone (as a scheduler or a container runtime does) and check the promise: exit 75,
    one line saying where it saved and how to resume, no traceback, no process of the job left, and the one
    committed checkpoint at the saved step. Returns that step."""
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, err[-3000:]
    lines = launch_lines(err)
    assert len(lines) == 1 and "preempted by SIGTERM" in lines[0] and "resume with" in lines[0], err[-2000:]
    assert "Traceback" not in err
    step = int(re.search(r"saved step (\d+)", lines[0]).group(1))  # type: ignore[union-attr]
    assert processes_with(run_dir) == []  # nothing of the job outlives the launcher
    committed = [
        r.step for r in list_checkpoints(os.path.join(run_dir, "checkpoints")) if r.status == "committed"
    ]
    assert committed == [step]
    return step


def two_signals_stop_at_once(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C, then SIGTERM at once, to the launcher; check that the second signal it saw ended the job at once:
    the exit status and its one line name that signal. Returns the launcher's stderr.

    Two signals sent back to back may reach a process with several threads in either order (POSIX keeps no order
    between them; a clean clone once saw SIGTERM first), so the second is whichever the launcher saw second. The
    same signal twice in a row would be merged by the kernel while the first is pending; a person's second
    Ctrl-C comes later and counts the same way."""
    os.kill(proc.pid, signal.SIGINT)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    second = {128 + s: s for s in (signal.SIGINT, signal.SIGTERM)}
    assert proc.returncode in second, err[-3000:]
    lines = launch_lines(err)
    named = f"stopped at once by a second {second[proc.returncode].name}"
    assert len(lines) == 1 and named in lines[0], err[-2000:]
    return err
