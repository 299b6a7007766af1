"""Storage that refuses the credentials (none, or wrong ones) against the real S3 server: every path ends in one
line naming the URL and where credentials are read from, with no traceback and no secret; exit 2 on the command
line, 78 (fatal: not retried by restarts) inside a run under ``goodput launch``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from goodput import (
    AccessRefused,
    CheckpointConfig,
    CheckpointManager,
    ConfigError,
    StorageError,
    TrainingState,
)
from goodput.job.codes import EXIT_FATAL
from goodput.job.crashloop import attempt_records
from goodput.testing import S3Server
from tests.helpers.commands import s3_env
from tests.helpers.paths import script

SCRIPT = script("user_storage_train.py")
WRONG_SECRET = "not-the-secret-0123456789"
CREDENTIALS = {
    "none": {},
    "wrong": {"AWS_ACCESS_KEY_ID": "nobody", "AWS_SECRET_ACCESS_KEY": WRONG_SECRET},
}


def _goodput(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "goodput", *args], env=env, capture_output=True, text=True, timeout=300
    )


def _one_refusal_line(done: subprocess.CompletedProcess[str], url: str, server: S3Server) -> str:
    """The last line of stderr, checked: the refusal naming ``url`` and the credentials' sources; no
    traceback and no secret anywhere in the output."""
    output = done.stdout + done.stderr
    assert "Traceback" not in output, done.stderr[-3000:]
    for secret in (WRONG_SECRET, server.secret_key, server.access_key):
        assert secret not in output
    last = done.stderr.strip().splitlines()[-1]
    assert url in last and "access refused" in last, done.stderr[-3000:]
    assert "AWS_ACCESS_KEY_ID" in last and "~/.aws/credentials" in last
    return last


@pytest.mark.s3
@pytest.mark.parametrize("keys", CREDENTIALS.values(), ids=CREDENTIALS.keys())
def test_goodput_ls_is_one_line_and_exit_2(
    keys: dict[str, str], s3_server: S3Server, s3_url: str, tmp_path: Path
) -> None:
    done = _goodput(s3_env(s3_server, tmp_path, keys), "ls", s3_url)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert _one_refusal_line(done, s3_url, s3_server).startswith("goodput ls: error: cannot list")


@pytest.mark.s3
@pytest.mark.parametrize("keys", CREDENTIALS.values(), ids=CREDENTIALS.keys())
def test_goodput_demo_with_refused_data_is_one_line_before_anything_starts(
    keys: dict[str, str], s3_server: S3Server, s3_url: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "demo"
    done = _goodput(
        s3_env(s3_server, tmp_path, keys), "demo", "--data-url", s3_url, "--run-dir", str(run_dir)
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert _one_refusal_line(done, s3_url, s3_server).startswith("goodput demo: error: cannot read")
    assert not (run_dir / "launches").exists()  # no training was started


@pytest.mark.s3
@pytest.mark.parametrize("keys", CREDENTIALS.values(), ids=CREDENTIALS.keys())
def test_a_manager_on_a_refused_root_raises_access_refused(
    keys: dict[str, str], s3_server: S3Server, s3_url: str
) -> None:
    options = {"client_kwargs": {"endpoint_url": s3_server.endpoint_url, "region_name": "us-east-1"}}
    if keys:
        options.update(key=keys["AWS_ACCESS_KEY_ID"], secret=keys["AWS_SECRET_ACCESS_KEY"])
    config = CheckpointConfig(root=s3_url, strategy="dcp", every=1, storage_options=options)
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            env.delenv(name, raising=False)
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        env.setenv("AWS_CONFIG_FILE", os.devnull)
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        with pytest.raises(AccessRefused) as refused:
            CheckpointManager(config, TrainingState(model=torch.nn.Linear(2, 2)))
    # a ConfigError (fatal in a run, exit 2 on the command line) and a StorageError (what storage code catches)
    assert isinstance(refused.value, ConfigError) and isinstance(refused.value, StorageError)
    assert str(refused.value).startswith(f"cannot write checkpoints to {s3_url} (access refused")
    assert WRONG_SECRET not in str(refused.value)


@pytest.mark.s3
@pytest.mark.slow
def test_launch_with_a_refused_checkpoint_root_stops_at_once_naming_rank_0(
    s3_server: S3Server, s3_url: str, tmp_path: Path
) -> None:
    """Rank 0 is refused while rank 1 waits for it: exit 78 at the first attempt (no crash loop), quoting rank
    0's refusal (not rank 1's broken connection)."""
    run_dir = tmp_path / "run"
    env = s3_env(s3_server, tmp_path, CREDENTIALS["none"])
    done = _goodput(env, "launch", "--nproc", "2", "--run-dir", str(run_dir), "--", SCRIPT, "--ckpt", s3_url)
    assert done.returncode == EXIT_FATAL, done.stderr[-3000:]
    last = _one_refusal_line(done, s3_url, s3_server)
    assert last.startswith("goodput launch: stopped: rank 0: AccessRefused: cannot write checkpoints to")
    assert [ln for ln in done.stderr.splitlines() if ln.startswith("goodput launch:")] == [last]
    assert attempt_records(str(run_dir)) == ["attempt-0.json"]  # no restarted attempt


@pytest.mark.s3
@pytest.mark.slow
def test_launch_with_refused_data_stops_at_once(s3_server: S3Server, s3_url: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = s3_env(s3_server, tmp_path, CREDENTIALS["wrong"])
    done = _goodput(env, "launch", "--run-dir", str(run_dir), "--", SCRIPT, "--data", s3_url)
    assert done.returncode == EXIT_FATAL, done.stderr[-3000:]
    last = _one_refusal_line(done, s3_url, s3_server)
    assert last.startswith("goodput launch: stopped: rank 0: AccessRefused: cannot read")
    assert attempt_records(str(run_dir)) == ["attempt-0.json"]
