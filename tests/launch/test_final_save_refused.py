"""A store that refuses writes when the job reaches its last step (the real S3 server behind the fault proxy,
answering 507 Insufficient Storage to the final step's uploads): the final save is tried again with backoff, one
line per try naming the store and the error, and the job ends once, exit 0, when the store takes writes again;
a store that stays full past ``$GOODPUT_FINAL_SAVE_TIMEOUT`` fails the job with one line, the previous
checkpoint untouched. Periodic saves keep failing quietly (tests/checkpoint/test_checkpoint_diskfull.py)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from goodput.checkpoint import list_checkpoints
from goodput.checkpoint._final_save import final_save_timeout, pause_before
from goodput.errors import ConfigError
from goodput.job.crashloop import attempt_records
from goodput.ledger import read_events
from goodput.ledger.accounting import account
from goodput.testing import S3Server
from goodput.testing.faultproxy import FaultProxy
from tests.helpers.commands import s3_env
from tests.helpers.paths import script

SCRIPT = script("user_storage_train.py")  # saves every 4 steps: 4 and 8 commit, 10 is the final save
STEPS = 10


def _final_writes(method: str, path: str) -> bool:
    """What the full store refuses: the final step's uploads and multipart requests (PUT, POST), nothing else."""
    return f"/step-{STEPS}/" in path and (method == "PUT" or (method == "POST" and "?delete" not in path))


def _launch(
    server: S3Server, proxy: FaultProxy, url: str, tmp_path: Path, nproc: int, **env: str
) -> tuple[subprocess.Popen[str], Path]:
    """``goodput launch`` of the script with its checkpoints at ``url`` through ``proxy`` (output to a file)."""
    keys = {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}
    environ = {**s3_env(server, tmp_path, keys), "AWS_ENDPOINT_URL": proxy.endpoint_url, **env}
    run_dir = tmp_path / "run"
    args = ["launch", "--nproc", str(nproc), "--max-restarts", "0", "--run-dir", str(run_dir)]
    args += ["--", SCRIPT, "--ckpt", url, "--steps", str(STEPS)]
    output = (tmp_path / "output.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "goodput", *args], env=environ, stdout=output, stderr=output, text=True
    )
    output.close()
    return proc, run_dir


@contextlib.contextmanager
def _launch_on_a_full_store(
    server: S3Server, url: str, tmp_path: Path, nproc: int, **env: str
) -> Iterator[tuple[FaultProxy, subprocess.Popen[str], Path]]:
    """``_launch`` through a proxy that answers 507 to the final step's writes until its faults are cleared."""
    with FaultProxy(server.s3_port) as proxy:
        proxy.fail_next(1 << 30, status=507, code="InsufficientStorage", match=_final_writes)
        proc, run_dir = _launch(server, proxy, url, tmp_path, nproc, **env)
        yield proxy, proc, run_dir


def _events(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return read_events(str(run_dir), rank=None)
    except (FileNotFoundError, ValueError):  # no ledger yet
        return []


def _wait_until(done: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"the launch ended ({proc.returncode}) first"
        assert time.monotonic() < deadline, f"not seen in {timeout}s"
        time.sleep(0.1)  # polling the job's ledger for a condition, not a synchronisation by time


def _committed(server: S3Server, url: str) -> list[int]:
    """The committed steps, read from the server itself (past the proxy), newest first."""
    options = {**server.storage_options(), "skip_instance_cache": True}
    return [r.step for r in list_checkpoints(url, storage_options=options) if r.status == "committed"]


def _final_failures(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in _events(run_dir) if e["event"] == "checkpoint_failed" and e.get("step") == STEPS]


@pytest.mark.s3
@pytest.mark.slow
def test_a_final_save_the_store_refuses_for_a_while_is_tried_again_and_the_job_ends_once(
    s3_server: S3Server, s3_url: str, tmp_path: Path
) -> None:
    with _launch_on_a_full_store(s3_server, s3_url, tmp_path, nproc=2) as (proxy, proc, run_dir):
        _wait_until(lambda: bool(_final_failures(run_dir)), proc)  # the first final save was refused
        proxy.clear_faults()  # room again
        assert proc.wait(timeout=240) == 0, (tmp_path / "output.log").read_text()[-4000:]
        refused = proxy.injected().get("fail", 0)
    output = (tmp_path / "output.log").read_text()
    assert refused >= 1
    assert attempt_records(str(run_dir)) == ["attempt-0.json"]  # one attempt: no restart
    assert _committed(s3_server, s3_url)[0] == STEPS
    tries = [ln for ln in output.splitlines() if "the final save of step 10 to" in ln]
    assert tries and all(
        s3_url in ln and "InsufficientStorage" in ln and "trying again in" in ln for ln in tries
    )
    for secret in (s3_server.secret_key, s3_server.access_key):
        assert secret not in output
    events = read_events(str(run_dir), rank=None)
    assert any(e["event"] == "checkpoint_durable" and e["step"] == STEPS for e in events)
    pauses = [
        e for e in read_events(str(run_dir), rank=0) if e["event"] == "checkpoint_stall" and e.get("retry")
    ]
    assert pauses and pauses[0]["phase"] == "start"
    acc = account(events)
    assert sum(acc.categories.values()) == pytest.approx(acc.wall_seconds, abs=1e-6)  # the ledger still tiles
    paused = sum(float(e["seconds"]) for e in pauses if e["phase"] == "end")
    assert acc.categories["checkpoint_stall"] >= paused  # the wait for the store is stall, not "other"
    assert acc.failures == 0


@pytest.mark.s3
@pytest.mark.slow
def test_a_store_full_past_the_bound_fails_the_final_save_in_one_line_and_keeps_the_previous_checkpoint(
    s3_server: S3Server, s3_url: str, tmp_path: Path
) -> None:
    full = _launch_on_a_full_store(s3_server, s3_url, tmp_path, nproc=1, GOODPUT_FINAL_SAVE_TIMEOUT="2")
    with full as (_, proc, run_dir):
        code = proc.wait(timeout=240)
    output = (tmp_path / "output.log").read_text()
    assert code != 0, output[-4000:]
    gave_up = [ln for ln in output.splitlines() if "the final save of step 10 to" in ln and "failed" in ln]
    last = [ln for ln in gave_up if "GOODPUT_FINAL_SAVE_TIMEOUT sets how long" in ln]
    assert last, output[-4000:]
    assert s3_url in last[0] and "InsufficientStorage" in last[0]
    assert "the previous checkpoint (step 8) is untouched" in last[0]
    assert s3_server.secret_key not in output
    assert _committed(s3_server, s3_url)[0] == 8  # the previous checkpoint intact, nothing of step 10
    assert len(_final_failures(run_dir)) >= 2  # tried again before giving up


def test_the_bound_is_read_and_checked() -> None:
    assert final_save_timeout({}) == 300.0
    assert final_save_timeout({"GOODPUT_FINAL_SAVE_TIMEOUT": "0"}) == 0.0
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.raises(ConfigError, match=f"GOODPUT_FINAL_SAVE_TIMEOUT must be .* got '{bad}'"):
            final_save_timeout({"GOODPUT_FINAL_SAVE_TIMEOUT": bad})


def test_the_pauses_double_up_to_a_cap_and_end_with_the_bound() -> None:
    assert [pause_before(n, 1000.0) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert pause_before(3, 2.5) == 2.5  # never past the bound
    assert pause_before(1, 0.0) is None and pause_before(1, -1.0) is None  # spent: give up
