"""goodput launch over real torchrun: restarts after SIGKILLs reach a working gloo group; crash loops stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from goodput.run.launch import EXIT_CRASH_LOOP, LaunchConfig, torchrun_command

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def _goodput(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "goodput", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_restarts_after_sigkills_rejoin_a_fresh_group(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    script = os.path.join(SCRIPTS, "restart_worker.py")
    proc = _goodput("launch", "--nproc", "2", "--max-restarts", "3", "--run-dir", run_dir, "--", script, "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        with open(os.path.join(run_dir, f"done-rank{rank}.json")) as f:
            done = json.load(f)
        # Two attempts were killed; the third (attempt 2) finished with a working all-reduce.
        assert done == {"attempt": 2, "sum": 3.0, "world": 2}


@pytest.mark.slow
def test_crash_loop_stops_torchrun_with_its_own_exit_code(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    script = os.path.join(SCRIPTS, "crashloop_worker.py")
    proc = _goodput("launch", "--max-restarts", "8", "--crash-loop", "2", "--run-dir", run_dir, "--", script)
    assert proc.returncode == EXIT_CRASH_LOOP, proc.stderr[-3000:]
    assert "crash loop: the last 2 attempts made no progress" in proc.stderr
    # Attempt 2 (after attempts 0 and 1 failed) gave the verdict; torchrun may start an attempt or two more
    # while the launcher reacts, but it stops long before the 8 restarts run out.
    attempts = os.listdir(os.path.join(run_dir, "attempts"))
    assert "attempt-2.json" in attempts and len(attempts) <= 5, attempts


def test_multi_node_needs_a_rendezvous_endpoint() -> None:
    proc = _goodput("launch", "--nnodes", "2", "--", "train.py", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--rdzv-endpoint" in proc.stderr


def test_bad_fault_plan_is_refused_before_starting(tmp_path: os.PathLike[str]) -> None:
    proc = _goodput("launch", "--faults", "kill@when=now", "--", "train.py", timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_torchrun_command_for_multi_node() -> None:
    cmd = torchrun_command(
        LaunchConfig(script=("t.py",), nproc=2, nnodes="2", node_rank=1, rdzv_endpoint="127.0.0.1:29400")
    )
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--rdzv-endpoint=127.0.0.1:29400" in cmd and "--node-rank=1" in cmd and "--standalone" not in cmd
    assert cmd[-1] == "t.py"
