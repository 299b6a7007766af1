"""Helpers for tests that run `goodput launch` as a real process and signal it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
WORKER = os.path.join(SCRIPTS, "run_worker.py")


def start_launch(*args: str) -> subprocess.Popen[str]:
    """`goodput launch ARGS` in the background (stdout and stderr captured)."""
    return subprocess.Popen(
        [sys.executable, "-m", "goodput", "launch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


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
    needle = f"GOODPUT_RUN_DIR={os.path.abspath(run_dir)}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            found.append(int(name))
    return found


def launch_lines(stderr: str) -> list[str]:
    """The launcher's own lines in its stderr."""
    return [line for line in stderr.splitlines() if line.startswith("goodput launch:")]
