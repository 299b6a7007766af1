"""``goodput`` commands that several tests run as a user would, in a real process, and an S3 environment for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from goodput.cli import main
from goodput.testing import S3Server

# verify-resume's finished command and its work folder
Verified = tuple[subprocess.CompletedProcess[str], str]


def verify_resume_two_kills(tmp_path_factory: pytest.TempPathFactory, script: str, steps: int) -> Verified:
    """``goodput verify-resume --nproc 2 --kills 2 --seed 1`` of ``script STEPS`` in a new temporary folder:
    the finished command and that folder."""
    work = str(tmp_path_factory.mktemp("verify"))
    command = ["verify-resume", "--nproc", "2", "--kills", "2", "--seed", "1", "--work-dir", work]
    proc = subprocess.run(
        [sys.executable, "-m", "goodput", *command, "--", script, str(steps)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, work


def assert_identical_after_two_kills(proc: subprocess.CompletedProcess[str]) -> None:
    """That verify-resume's verdict is IDENTICAL after both kills fired, without a traceback."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "IDENTICAL" in proc.stdout and "after 2 restarts (2 kills fired)" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def refused_in_one_line(capsys: pytest.CaptureFixture[str], *argvs: list[str]) -> str:
    """What ``goodput ARGV`` (run in this process) wrote to stderr for each of ``argvs``, once each exited 2
    without a traceback."""
    for argv in argvs:
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


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


def s3_env(server: S3Server, tmp_path: Path, keys: dict[str, str]) -> dict[str, str]:
    """This process's environment pointed at the server with ``keys`` as the only credentials."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ENDPOINT_URL=server.endpoint_url,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
        AWS_CONFIG_FILE=str(tmp_path / "no-config"),
        AWS_EC2_METADATA_DISABLED="true",
        **keys,
    )
    return env
