"""``goodput`` commands that several tests run as a user would, in a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def verify_resume_two_kills(work: str, script: str, steps: int) -> subprocess.CompletedProcess[str]:
    """``goodput verify-resume --nproc 2 --kills 2 --seed 1`` of ``script STEPS`` in ``work``."""
    command = ["verify-resume", "--nproc", "2", "--kills", "2", "--seed", "1", "--work-dir", work]
    return subprocess.run(
        [sys.executable, "-m", "goodput", *command, "--", script, str(steps)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def assert_identical_after_two_kills(proc: subprocess.CompletedProcess[str]) -> None:
    """That verify-resume's verdict is IDENTICAL after both kills fired, without a traceback."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "IDENTICAL" in proc.stdout and "after 2 restarts (2 kills fired)" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def report_json(run_dir: str) -> dict[str, Any]:
    """What ``goodput report RUN_DIR --json`` prints, once it exited 0."""
    report = subprocess.run(
        [sys.executable, "-m", "goodput", "report", run_dir, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    data: dict[str, Any] = json.loads(report.stdout)
    return data
