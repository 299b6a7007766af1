"""A SIGKILLed ``goodput launch`` runs no clean-up of its own, yet no process of its job outlives it: torchrun (or
the warm agent) is SIGKILLed by the kernel when the launcher ends, each worker and hot spare when its parent
ends, and each DataLoader worker process when its rank ends (``PR_SET_PDEATHSIG``,
``goodput._lifetime.end_with_parent``). Real processes, real SIGKILL; the job must be gone within 2 s (torch's
DataLoader workers notice a dead parent by themselves only after about 5 s)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import goodput.bench
from goodput.warm.record import record_folder
from tests.helpers.launching import WORKER, processes_with, start_launch, wait_for_file

WARM_SCRIPT = os.path.join(os.path.dirname(goodput.bench.__file__), "_restart_train.py")


def _wait_until(
    condition: Callable[[], bool], proc: subprocess.Popen[str], what: str, timeout: float = 120.0
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, (
            f"launch ended ({proc.returncode}) before {what}: {proc.stderr.read()[-3000:]}"
        )
        assert time.monotonic() < deadline, f"no {what} after {timeout}s"
        time.sleep(0.1)  # polling for a condition, not a synchronisation by time


def _long_job(
    run_dir: str, script: str, *script_args: str, launch: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    """Two ranks of ``script`` for 2000 steps of 0.05 s: a job still running when the test kills its launcher."""
    return start_launch(
        *launch, "--nproc", "2", "--run-dir", run_dir, "--",
        script, "--steps", "2000", "--step-seconds", "0.05", *script_args,
    )  # fmt: skip


_PROMPTLY = 2.0  # seconds from the launcher's SIGKILL until no process of the job is left


def _killed_leaves_nothing(proc: subprocess.Popen[str], run_dir: str) -> None:
    job = processes_with(run_dir)
    assert job, "the job's processes were not found"
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + _PROMPTLY
    proc.wait(timeout=30)  # its pipes stay open as long as any process of the job lives: not read here
    while processes_with(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel's signals land within milliseconds; polled, not slept on
    left = processes_with(run_dir)
    names = [_command(pid) for pid in left]
    for pid in left:  # leave the machine clean even when the test fails
        os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert left == [], (
        f"{len(left)} of the job's {len(job)} processes outlived the SIGKILLed launcher by {_PROMPTLY}s: "
        f"{names}"
    )


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode()[-100:]
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
        return f"{command} (ppid {status['PPid'].strip()}, {status['State'].strip()}, threads {status['Threads'].strip()})"
    except OSError:
        return f"{pid} (gone)"


@pytest.mark.slow
def test_a_sigkilled_launcher_takes_torchrun_every_worker_and_their_data_workers_with_it(
    tmp_path: Path,
) -> None:
    run_dir = str(tmp_path / "run")
    proc = _long_job(run_dir, WORKER, "--workers", "2")
    wait_for_file(os.path.join(run_dir, "training"), proc)
    # torchrun, 2 ranks and their 2 DataLoader worker processes each
    _wait_until(lambda: len(processes_with(run_dir)) >= 7, proc, "the DataLoader workers")
    _killed_leaves_nothing(proc, run_dir)


@pytest.mark.slow
def test_a_sigkilled_warm_launcher_takes_the_agent_workers_data_workers_and_spare_with_it(
    tmp_path: Path,
) -> None:
    """And its RNG records' RAM folder, which nothing of the killed launch could remove, is swept by the next
    warm launch on the machine (its owner, the killed agent, provably ended)."""
    run_dir = str(tmp_path / "run")
    proc = _long_job(run_dir, WARM_SCRIPT, "--workers", "2", launch=("--restart", "warm"))
    samples = os.path.join(run_dir, "samples", "rank-0.jsonl")
    # the agent, 2 ranks, their 2 DataLoader worker processes each, and a spare
    _wait_until(lambda: os.path.exists(samples) and len(processes_with(run_dir)) >= 8, proc, "a spare")
    launches = glob.glob(os.path.join(run_dir, "launches", "*"))
    left = [record_folder("", "", launch=os.path.basename(launch)) for launch in launches]
    try:
        _killed_leaves_nothing(proc, run_dir)
        assert left and all(os.path.isdir(folder) for folder in left)  # what a SIGKILL cannot clean up
        nxt = start_launch(
            "--restart", "warm", "--nproc", "2", "--run-dir", str(tmp_path / "next"), "--",
            WARM_SCRIPT, "--steps", "2", "--step-seconds", "0.01",
        )  # fmt: skip
        _, err = nxt.communicate(timeout=300)
        assert nxt.returncode == 0, err[-3000:]
        assert [folder for folder in left if os.path.exists(folder)] == []
    finally:  # leave the machine clean even when the test fails
        for folder in left:
            shutil.rmtree(folder, ignore_errors=True)


def _template_processes(run_dir: str) -> int:
    """The job's processes started as the spare template: the template and the spares it forked."""
    found = 0
    for pid in processes_with(run_dir):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            found += b"goodput.warm.template" in f.read().split(b"\0")
    return found


@pytest.mark.slow
def test_a_sigkilled_warm_launcher_takes_the_spare_template_and_its_forked_spares_with_it(
    tmp_path: Path,
) -> None:
    run_dir = str(tmp_path / "run")
    proc = _long_job(run_dir, WARM_SCRIPT, launch=("--restart", "warm", "--spares", "2"))
    _wait_until(lambda: _template_processes(run_dir) >= 3, proc, "a template with two forked spares")
    _killed_leaves_nothing(proc, run_dir)
