"""A script that fails with the same error in the same step every attempt is a crash loop, even though each
attempt trains from its checkpoint up to that step; an error that changes between attempts is restarted.

The user's side: ``goodput launch --max-restarts 10`` over the README's loop (``tests/scripts/run_worker.py``),
checkpoints every 5 steps, a ``ValueError`` raised in step 12 (so each attempt restores step 10 and completes
step 11 before it fails).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.job.codes import EXIT_CRASH_LOOP
from goodput.job.crashloop import attempt_records
from tests.helpers.launching import WORKER, launch_lines, processes_with


def _launch(run_dir: str, *args: str, nproc: int = 1) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "goodput", "launch", "--nproc", str(nproc), "--max-restarts", "10"]
    command += ["--run-dir", run_dir, "--", WORKER, "--every", "5", "--raise-at", "12", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_the_same_error_in_the_same_step_stops_after_three_attempts(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    proc = _launch(run_dir, "--raise-rank", "1", nproc=2)
    assert proc.returncode == EXIT_CRASH_LOOP, proc.stderr[-3000:]
    line = launch_lines(proc.stderr)[-1]
    assert line.startswith(
        "goodput launch: crash loop: the last 3 attempts failed with the same error in step 12: "
    ), line
    assert line.count("rank 1: ValueError: bad batch at step 12") == 1, (
        line
    )  # quoted once, the failing rank's
    # Attempts 0-2 failed, attempt 3 gave the verdict (torchrun may start one more while the launcher reacts):
    # far from the 10 restarts.
    assert 4 <= len(attempt_records(str(run_dir))) <= 5, attempt_records(str(run_dir))
    assert os.path.isdir(
        os.path.join(run_dir, "checkpoints", "step-10")
    )  # each attempt made progress from it
    assert processes_with(run_dir) == []


@pytest.mark.slow
@pytest.mark.parametrize("changing", ["step", "message"])
def test_an_error_that_changes_is_restarted(tmp_path: Path, changing: str) -> None:
    """Attempts 0-2 fail in steps 12, 13, 14 (or with the attempt in the message); attempt 3 must still start,
    and it trains to the end."""
    run_dir = str(tmp_path / "run")
    proc = _launch(run_dir, "--changing", changing)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(run_dir, "finished")) as f:
        assert f.read() == "20"
    assert len(attempt_records(str(run_dir))) == 4, attempt_records(str(run_dir))
