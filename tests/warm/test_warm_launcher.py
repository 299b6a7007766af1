"""`goodput launch --restart warm` keeps the cold launcher's promises, with real processes and real signals:
SIGTERM to the launcher alone saves once and exits 75 (spares included, nothing outlives it) and the relaunch
resumes; a second signal stops at once; a rank that fails at the same step every time is a crash loop (exit 3,
its error quoted), not a warm restart until --max-restarts; an error a restart cannot fix stops at once
(exit 78); an elastic node count or a timeout that is not positive is refused in one line."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import goodput.bench
from goodput.job.codes import EXIT_CRASH_LOOP, EXIT_FATAL
from goodput.ledger import read_events
from goodput.warm.record import record_folder
from tests.helpers.launching import (
    launch_lines,
    processes_with,
    sigterm_saves_once,
    start_launch,
    two_signals_stop_at_once,
)

SCRIPT = os.path.join(os.path.dirname(goodput.bench.__file__), "_restart_train.py")


def _warm(run_dir: str, *script_args: str, launch_args: tuple[str, ...] = ()) -> list[str]:
    """The launch arguments of a 2-rank warm job on the bench's DDP script."""
    head = ["--restart", "warm", "--nproc", "2", "--run-dir", run_dir, "--collective-timeout", "4"]
    return [*head, *launch_args, "--", SCRIPT, *script_args]


def _spares(run_dir: str) -> list[int]:
    """The job's hot spare processes (started as spares: their environment says so)."""
    needle = b"GOODPUT_WARM_ROLE=spare"
    found = []
    for pid in processes_with(run_dir):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def _wait_training_with_a_spare(run_dir: str, proc: subprocess.Popen[str], timeout: float = 180.0) -> None:
    """Poll until both ranks train and a hot spare waits (so the signal finds every kind of process)."""
    samples = os.path.join(run_dir, "samples", "rank-0.jsonl")
    deadline = time.monotonic() + timeout
    while not (os.path.exists(samples) and os.path.getsize(samples) > 0 and _spares(run_dir)):
        if proc.poll() is not None:
            raise AssertionError(f"launch ended ({proc.returncode}): {proc.stderr.read()[-3000:]}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            raise AssertionError(f"no training with a spare after {timeout}s")
        time.sleep(0.1)  # polling for a condition, not a synchronisation by time


def _no_records_left(run_dir: str) -> bool:
    """Whether the RAM folder of each launch's RNG records is gone."""
    launches = glob.glob(os.path.join(run_dir, "launches", "*"))
    return bool(launches) and not any(
        os.path.exists(record_folder("", "", launch=os.path.basename(p))) for p in launches
    )


@pytest.mark.slow
def test_sigterm_to_a_warm_launcher_saves_once_leaves_no_process_and_the_relaunch_resumes(
    tmp_path: Path,
) -> None:
    run_dir = str(tmp_path / "run")
    args = ("--steps", "600", "--every", "1000", "--strategy", "dcp_async")
    proc = start_launch(*_warm(run_dir, *args, "--step-seconds", "0.05"))
    _wait_training_with_a_spare(run_dir, proc)
    step = sigterm_saves_once(proc, run_dir)  # the agent, both workers and the spare: none outlives it
    assert _no_records_left(run_dir)
    preempted = [e for e in read_events(run_dir, rank=None) if e["event"] == "preempted"]
    assert sorted((e["rank"], e["step"]) for e in preempted) == [(0, step), (1, step)]

    again = subprocess.run(
        [sys.executable, "-m", "goodput", "launch", *_warm(run_dir, *args)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    restored = [e["step"] for e in read_events(run_dir) if e["event"] == "restore_end"]
    assert restored == [None, step]
    assert '"step": 600' in Path(run_dir, "final.json").read_text()
    assert processes_with(run_dir) == []


@pytest.mark.slow
def test_a_second_signal_stops_a_warm_job_at_once(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    proc = start_launch(*_warm(run_dir, "--steps", "2000", "--step-seconds", "0.05"))
    _wait_training_with_a_spare(run_dir, proc)
    two_signals_stop_at_once(proc)  # before any save
    assert processes_with(run_dir) == []
    assert _no_records_left(run_dir)


def _agent_events(run_dir: str) -> list[str]:
    path = os.path.join(run_dir, "warm", "agent.jsonl")
    if not os.path.exists(path):
        return []
    return [line.split('"event": "', 1)[1].split('"', 1)[0] for line in Path(path).read_text().splitlines()]


@pytest.mark.slow
def test_a_rank_that_fails_at_the_same_step_every_time_is_a_crash_loop_under_warm(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    # Checkpoints every 2 steps: even a cold fallback restores step 4 and makes no progress either.
    args = _warm(
        run_dir,
        "--steps",
        "40",
        "--every",
        "2",
        "--fail-at-step",
        "5",
        launch_args=("--max-restarts", "20", "--crash-loop", "2"),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "goodput", "launch", *args], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == EXIT_CRASH_LOOP, proc.stderr[-3000:]
    line = launch_lines(proc.stderr)[-1]  # after one line per failure
    # The first generation trained to step 4 before rank 1 failed, the next restored step 4: no progress in the
    # second, but both failed with the same error in step 5, which the verdict quotes (the failing rank's).
    assert "crash loop: the last 2 attempts failed with the same error in step 5: " in line, line
    assert line.count("rank 1: RuntimeError: bad batch at step 5") == 1, line
    events = _agent_events(run_dir)
    restarts = events.count("warm_restart") + events.count("cold_restart")
    assert 2 <= restarts <= 4, events  # stopped after the second failure, far from --max-restarts 20
    assert processes_with(run_dir) == []
    assert _no_records_left(run_dir)


@pytest.mark.slow
def test_warm_restarts_that_make_progress_are_no_crash_loop_whichever_rank_fails(tmp_path: Path) -> None:
    """Rank 1 fails twice, then rank 0: the process that takes rank 0 counts the generations rank 0 survived,
    each of which made progress (a surviving rank 0 records its attempts too), so the job completes."""
    run_dir = str(tmp_path / "run")
    faults = "kill@step=5,rank=1; kill@step=10,rank=1; kill@step=15,rank=0"
    args = _warm(
        run_dir,
        "--steps",
        "24",
        launch_args=("--max-restarts", "10", "--crash-loop", "2", "--faults", faults),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "goodput", "launch", *args], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _agent_events(run_dir).count("warm_restart") == 3
    assert '"step": 24' in Path(run_dir, "final.json").read_text()


@pytest.mark.slow
def test_a_config_error_on_one_rank_stops_a_warm_job_at_once(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    args = _warm(run_dir, "--steps", "40", "--fatal-at-step", "5", launch_args=("--max-restarts", "20"))
    proc = subprocess.run(
        [sys.executable, "-m", "goodput", "launch", *args], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == EXIT_FATAL, proc.stderr[-3000:]
    (line,) = launch_lines(proc.stderr)
    assert "stopped: rank 1: ConfigError: --fatal-at-step 5: a configuration no restart can fix" in line
    assert "Traceback" not in proc.stderr
    events = _agent_events(run_dir)
    assert events.count("warm_restart") + events.count("cold_restart") <= 1, events  # no spare took it on
    assert processes_with(run_dir) == []
    assert _no_records_left(run_dir)


def test_an_elastic_node_count_without_shrink_after_is_refused_in_one_line_naming_what_to_do() -> None:
    cmd = [sys.executable, "-m", "goodput", "launch", "--restart", "warm", "--nnodes", "1:2"]
    cmd += ["--rdzv-endpoint", "127.0.0.1:1", "--", "train.py"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert (
        "--restart warm" in proc.stderr and "--nnodes 1:2" in proc.stderr and "--shrink-after" in proc.stderr
    )
    assert "--nnodes N" in proc.stderr and "--restart cold" in proc.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "goodput", "launch", "--help"], capture_output=True, text=True, timeout=60
    )
    text = " ".join(shown.stdout.split())  # argparse wraps the options' help
    assert "An elastic --nnodes MIN:MAX needs --shrink-after" in text
    assert "with --restart warm it needs --shrink-after" in text


@pytest.mark.parametrize("flag", ["--reform-timeout", "--collective-timeout"])
def test_a_timeout_that_is_not_positive_is_refused_in_one_line_naming_its_flag(
    tmp_path: Path, flag: str
) -> None:
    cmd = [sys.executable, "-m", "goodput", "launch", "--restart", "warm", "--run-dir", str(tmp_path)]
    proc = subprocess.run([*cmd, flag, "0", "--", SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and flag in proc.stderr, proc.stderr
    assert not os.path.exists(os.path.join(tmp_path, "launches")), "nothing was launched"
