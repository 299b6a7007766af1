"""A quiet terminal under `goodput launch`: the workers' prints and logging, one line per failure and a final
line naming the cause, no tracebacks; the full logs (tracebacks and torchrun's own lines) in the launch folder;
`--verbose` shows everything. Real torchrun, the real warm agent, real SIGKILLs."""

from __future__ import annotations

import glob
import os
import pathlib
import re
import subprocess
import sys

import pytest

import goodput.bench
from goodput.job.codes import EXIT_CRASH_LOOP
from goodput.launch.output import TracebackFilter, describe_exit
from tests.helpers.launching import WORKER, launch_lines

WARM_SCRIPT = os.path.join(os.path.dirname(goodput.bench.__file__), "_restart_train.py")
_FEW = 12  # terminal lines a short job with a failure or three may print, the worker's own prints aside


def _launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "goodput", "launch", *args], capture_output=True, text=True, timeout=300
    )


def _terminal(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """Every line the launch printed, but the worker's prints of ``run_worker.py --say``."""
    lines = (proc.stdout + proc.stderr).splitlines()
    return [line for line in lines if not line.startswith(("worker says:", "worker logs:"))]


def _logs(run_dir: str, name: str) -> str:
    paths = glob.glob(os.path.join(run_dir, "launches", "*", "logs", "**", name), recursive=True)
    assert paths, f"no {name} in the launch folder"
    return "".join(open(path, errors="replace").read() for path in paths)


def test_a_traceback_is_dropped_and_the_rest_kept() -> None:
    stderr = [
        "WARNING:train:lr warmup ends at step 100",
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "train.py", line 18, in <module>',
        '[rank0]:     raise ValueError("bad")',
        "[rank0]: KeyError: 'x'",
        "[rank0]: ",
        "[rank0]: The above exception was the direct cause of the following exception:",
        "[rank0]: ",
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "train.py", line 20, in <module>',
        "[rank0]: torch.distributed.DistBackendError: Connection closed by peer",
        "[rank0]: Exception raised from recvBytes at pair.cc:678 (most recent call first):",
        "[rank0]: frame #0: c10::Error::Error() + 0x98 (0x7f in libc10.so)",
        "Exception in thread goodput-prefetch:",
        "Traceback (most recent call last):",
        '  File "threading.py", line 1045, in _bootstrap_inner',
        "RuntimeError: stop",
        "step 7 | loss 0.25",
    ]
    keep = TracebackFilter()
    assert [line for line in stderr if keep.keep(line)] == [
        "WARNING:train:lr warmup ends at step 100",
        "step 7 | loss 0.25",
    ]


def test_an_exit_in_a_few_words(tmp_path: os.PathLike[str]) -> None:
    error = os.path.join(tmp_path, "error.json")
    with open(error, "w") as f:
        f.write('{"message": {"message": "ValueError: bad batch\\nmore", "extraInfo": {"timestamp": "1"}}}')
    assert describe_exit(-9, None) == "killed by SIGKILL"
    assert describe_exit(1, error) == "exited with status 1 (ValueError: bad batch)"
    assert describe_exit(3, os.path.join(tmp_path, "absent.json")) == "exited with status 3"


@pytest.mark.slow
def test_a_killed_rank_is_one_line_and_the_workers_prints_still_show(tmp_path: os.PathLike[str]) -> None:
    run_dir = os.path.join(tmp_path, "run")
    proc = _launch(
        "--nproc", "2", "--faults", "kill@step=4,rank=1", "--run-dir", run_dir, "--", WORKER, "--steps", "8", "--say"
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "worker says: step 8" in proc.stdout  # the user's prints and logging reach the terminal
    assert "worker logs: step 8" in proc.stderr
    # torchrun names the failure whose time is the earliest, in whole seconds: the SIGKILLed rank 1, or rank 0
    # when torchrun's SIGTERM to it lands in the same second (seen once on a loaded machine)
    lines = launch_lines(proc.stderr)
    assert len(lines) == 1 and re.fullmatch(
        r"goodput launch: rank (1 killed by SIGKILL|0 killed by SIGTERM); torchrun restarts the job "
        r"\(restart 1 of 3\)",
        lines[0],
    ), lines
    terminal = _terminal(proc)
    assert len(terminal) <= _FEW and not any(
        "Traceback" in line or "exitcode" in line for line in terminal
    ), terminal
    # torchrun's own log, kept: it names the same failure as the line above
    named = (
        "failed (exitcode: -9) local_rank: 1"
        if "SIGKILL" in lines[0]
        else "failed (exitcode: -15) local_rank: 0"
    )
    assert named in _logs(run_dir, "torchrun.log")


@pytest.mark.slow
def test_a_script_that_raises_at_step_0_ends_on_its_cause_in_a_few_lines(tmp_path: os.PathLike[str]) -> None:
    run_dir, broken = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "broken")
    open(broken, "w").close()
    proc = _launch(
        "--nproc", "2", "--crash-loop", "2", "--run-dir", run_dir, "--", WORKER, "--broken", broken
    )
    assert proc.returncode == EXIT_CRASH_LOOP, proc.stderr[-3000:]
    terminal = _terminal(proc)
    assert len(terminal) <= _FEW and not any("Traceback" in line for line in terminal), terminal
    assert "exited with status 1 (RuntimeError: broken input" in terminal[0]
    assert (
        terminal[-1].startswith("goodput launch: crash loop:")
        and "RuntimeError: broken input" in terminal[-1]
    )
    assert "Traceback (most recent call last)" in _logs(run_dir, "stderr.log")


@pytest.mark.slow
def test_verbose_shows_the_tracebacks(tmp_path: os.PathLike[str]) -> None:
    run_dir, broken = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "broken")
    open(broken, "w").close()
    proc = _launch("--verbose", "--max-restarts", "0", "--run-dir", run_dir, "--", WORKER, "--broken", broken)
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr and "failed (exitcode: 1)" in proc.stderr


@pytest.mark.slow
def test_warm_failures_are_one_line_each_and_the_logs_keep_the_rest(tmp_path: os.PathLike[str]) -> None:
    run_dir, other = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "other")
    head = ("--restart", "warm", "--nproc", "2", "--collective-timeout", "4")
    proc = _launch(
        *head, "--run-dir", run_dir, "--faults", "kill@step=5,rank=1", "--", WARM_SCRIPT, "--steps", "12"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = launch_lines(proc.stderr)
    assert line.startswith("goodput launch: rank 1 killed by SIGKILL; warm hand-over to "), line
    terminal = _terminal(proc)
    assert len(terminal) <= _FEW and not any("Traceback" in line for line in terminal), terminal
    # A rank that raises every time: a line per failure, the verdict last, the tracebacks in the logs.
    again = _launch(
        *head,
        "--run-dir",
        other,
        "--crash-loop",
        "2",
        "--",
        WARM_SCRIPT,
        "--steps",
        "12",
        "--fail-at-step",
        "3",
    )
    assert again.returncode == EXIT_CRASH_LOOP, again.stderr[-3000:]
    terminal = _terminal(again)
    assert len(terminal) <= _FEW and not any("Traceback" in line for line in terminal), terminal
    assert "rank 1 exited with status 1 (RuntimeError: " in terminal[0], terminal
    assert terminal[-1].startswith("goodput launch: crash loop:"), terminal
    assert "Traceback (most recent call last)" in _logs(other, "stderr.log")


def test_a_pid_marker_still_being_written_is_not_a_rank(tmp_path: pathlib.Path) -> None:
    """A rank writes its pid marker as rank-N.PID.tmp, then renames it: the terminal must skip the .tmp."""
    from goodput.job.folder import PIDS_DIR
    from goodput.launch.output import Terminal

    pids = tmp_path / PIDS_DIR
    pids.mkdir()
    (pids / "rank-1").write_text("4242")
    (pids / "rank-2.4243.tmp").write_text("4243")
    terminal = Terminal(str(tmp_path), verbose=False, max_restarts=0, warm=True)
    terminal._learn_ranks()  # raised ValueError on the .tmp name
    assert terminal._ranks == {4242: 1}
