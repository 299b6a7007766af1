"""Preemption with real processes and real signals: SIGTERM to the launcher alone, Ctrl-C twice, a signal on
one rank only, a grace period that runs out, and `python train.py` as one rank."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.checkpoint import list_checkpoints
from goodput.job.codes import EXIT_PREEMPTED
from goodput.ledger import read_events
from goodput.ledger.report import load_report
from goodput.run.signals import PreemptionWatch
from tests.helpers.launching import (
    SCRIPTS,
    WORKER,
    launch_lines,
    processes_with,
    sigterm_saves_once,
    start_launch,
    start_training,
    two_signals_stop_at_once,
    wait_for_file,
)


def _preempted(run_dir: str) -> list[dict]:
    return [e for e in read_events(run_dir, rank=None) if e["event"] == "preempted"]


def test_a_single_process_stops_at_the_step_after_its_signal() -> None:
    watch = PreemptionWatch(rank=0, world_size=1, signum=signal.SIGUSR2)
    try:
        watch.start(0)
        assert not watch.should_stop(1)
        os.kill(os.getpid(), signal.SIGUSR2)  # real signal; the handler only sets the flag
        assert watch.should_stop(2) and watch.requested == "SIGUSR2"
    finally:
        watch.close()
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # the previous handler is back


@pytest.mark.slow
def test_sigterm_to_the_launcher_alone_saves_once_then_the_relaunch_resumes(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    args = ("--nproc", "2", "--run-dir", run_dir, "--", WORKER, "--steps", "200")
    # the first launch keeps a pace (10 s of steps for the signal to land in); the relaunch needs none
    proc = start_launch(*args, "--step-seconds", "0.05", "--strategy", "dcp_async")
    wait_for_file(os.path.join(run_dir, "training"), proc)
    step = sigterm_saves_once(proc, run_dir)
    assert sorted((e["rank"], e["step"]) for e in _preempted(run_dir)) == [(0, step), (1, step)]

    again = subprocess.run(
        [sys.executable, "-m", "goodput", "launch", *args], capture_output=True, text=True, timeout=240
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert Path(run_dir, "finished").read_text() == "200"
    restored = [e["step"] for e in read_events(run_dir) if e["event"] == "restore_end"]
    assert restored == [None, step]
    report = subprocess.run(
        [sys.executable, "-m", "goodput", "report", run_dir], capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0 and "preempted" in report.stdout, report.stdout + report.stderr
    # the preemption is no failure, and the relaunch is a new launch: its wait is not restart downtime
    data = load_report(run_dir).to_dict()
    assert (data["failures"], data["preemptions"], data["mtbf_seconds"]) == (0, 1, None)
    assert (data["launches"], data["restarts"]) == (2, 0)
    assert data["categories"]["restart_downtime"] == 0.0 and data["categories"]["between_launches"] > 0.0
    assert data["goodput"] == pytest.approx(data["categories"]["productive"] / data["job_seconds"])


@pytest.mark.slow
def test_a_signal_on_one_rank_only_makes_every_rank_save_the_same_step(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    proc = start_training(run_dir, "--nproc", "2", "--", WORKER, "--steps", "400", "--step-seconds", "0.03")
    (pid_file,) = glob.glob(os.path.join(run_dir, "launches", "*", "pids", "rank-1"))
    os.kill(int(Path(pid_file).read_text()), signal.SIGUSR1)  # as SLURM's --signal=USR1@90 may: one process
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, err[-3000:]
    steps = {e["rank"]: e["step"] for e in _preempted(run_dir)}
    assert set(steps) == {0, 1} and steps[0] == steps[1]
    assert processes_with(run_dir) == []


@pytest.mark.slow
def test_a_second_signal_stops_everything_at_once(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    proc = start_training(run_dir, "--nproc", "2", "--", WORKER, "--steps", "2000", "--step-seconds", "0.05")
    two_signals_stop_at_once(proc)
    assert processes_with(run_dir) == []


@pytest.mark.slow
def test_a_job_that_cannot_save_is_ended_after_the_grace_period_with_no_orphans(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    script = os.path.join(SCRIPTS, "sleeper.py")
    proc = start_launch("--nproc", "2", "--grace", "2s", "--run-dir", run_dir, "--", script)
    wait_for_file(os.path.join(run_dir, "training"), proc)
    assert processes_with(run_dir)  # torchrun, two workers, their grandchildren in sessions of their own
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    lines = launch_lines(err)
    assert len(lines) == 1 and "no checkpoint within the grace period" in lines[0]
    assert processes_with(run_dir) == []


@pytest.mark.slow
def test_python_train_py_is_one_rank_that_saves_on_its_signal_and_then_completes(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    cmd = [sys.executable, WORKER, "--run-dir", run_dir, "--steps", "200"]
    proc = subprocess.Popen(
        [*cmd, "--step-seconds", "0.02"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for_file(os.path.join(run_dir, "training"), proc)  # DDP on a one-process group trains
    os.kill(proc.pid, signal.SIGUSR1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_PREEMPTED, err[-3000:]
    assert err.strip().count("\n") == 0 and "goodput: preempted by SIGUSR1: saved step" in err
    (event,) = _preempted(run_dir)
    assert [r.step for r in list_checkpoints(os.path.join(run_dir, "checkpoints"))] == [event["step"]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and Path(run_dir, "finished").read_text() == "200", done.stderr[-2000:]
