"""``goodput launch`` refuses what cannot work before it starts anything (one line, exit 2), and its crash-loop
verdict quotes the rank whose error started the failure, not a peer's reaction to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.job.folder import LOGS_DIR, is_peer_failure_line, last_error
from tests.helpers.paths import script

SCRIPT = script("user_storage_train.py")


def _launch(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GOODPUT_RUN_DIR"}
    return subprocess.run(
        [sys.executable, "-m", "goodput", "launch", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.strip()


def test_a_missing_script_is_refused_before_anything_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    line = _one_line(_launch("--run-dir", str(run_dir), "--", "no_such_train.py", "--lr", "1"))
    assert "'no_such_train.py' does not exist" in line
    assert not (run_dir / "launches").exists()  # torchrun never started


def test_a_mistyped_command_is_one_line_naming_the_nearest() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "goodput", "lanch", "--nproc", "2", "--", "train.py"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    line = _one_line(done)
    assert "'lanch'" in line and "did you mean 'launch'?" in line, line


def test_a_missing_module_is_refused_and_a_present_one_is_not(tmp_path: Path) -> None:
    line = _one_line(_launch("--run-dir", str(tmp_path / "run"), "--", "-m", "no_such_pkg_xyz.train"))
    assert "module 'no_such_pkg_xyz.train' not found" in line
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text("raise SystemExit(0)\n")
    done = _launch("--run-dir", str(tmp_path / "run"), "--", "-m", "mypkg.train", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]  # found from the current folder, as `python -m` finds it


def test_no_run_dir_is_refused_in_one_line_naming_the_flag(tmp_path: Path) -> None:
    line = _one_line(_launch("--", SCRIPT))
    assert "launch needs --run-dir" in line and "--run-dir runs/user_storage_train" in line


def test_the_run_dir_may_come_from_the_environment(tmp_path: Path) -> None:
    env = {**os.environ, "GOODPUT_RUN_DIR": str(tmp_path / "from-env")}
    done = subprocess.run(
        [sys.executable, "-m", "goodput", "launch", "--", "no_such_train.py"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "does not exist" in done.stderr  # the script is the only complaint


def test_a_run_dir_that_cannot_be_created_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    line = _one_line(_launch("--run-dir", str(tmp_path / "file" / "run"), "--", SCRIPT))
    assert "cannot be created" in line


def _error_file(folder: Path, rel: str, line: str, stamp: float, **extra: str) -> None:
    path = folder / LOGS_DIR / rel / "error.json"
    path.parent.mkdir(parents=True)
    info = {"py_callstack": "...", "timestamp": str(int(stamp)), **extra}
    path.write_text(json.dumps({"message": {"message": line, "extraInfo": info}}))
    os.utime(path, (stamp, stamp))


GLOO = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:40080"
)


@pytest.mark.parametrize("flagged", [True, False], ids=["goodput-error-files", "torch-error-files"])
def test_the_verdict_quotes_the_root_error_not_a_peers_reaction(tmp_path: Path, flagged: bool) -> None:
    def flags(peer: bool, rank: int) -> dict[str, str]:
        return {"goodput_rank": str(rank), "goodput_peer_failure": "1" if peer else "0"} if flagged else {}

    for attempt in range(3):  # rank 0 fails, rank 1's collective breaks a moment later
        when = 1_000_000 + 10 * attempt
        _error_file(
            tmp_path,
            f"r/attempt_{attempt}/0",
            "NoCredentialsError: Unable to locate credentials",
            when,
            **flags(False, 0),
        )
        _error_file(tmp_path, f"r/attempt_{attempt}/1", GLOO, when + 1, **flags(True, 1))
    quoted = last_error(str(tmp_path))
    assert quoted is not None and quoted.endswith(": NoCredentialsError: Unable to locate credentials")
    assert quoted.startswith("rank 0" if flagged else "local rank 0")


def test_only_reactions_recorded_quotes_the_newest(tmp_path: Path) -> None:
    _error_file(tmp_path, "r/attempt_0/1", GLOO, 1_000_000)
    _error_file(tmp_path, "r/attempt_1/1", "DistBackendError: NCCL communicator was aborted", 1_000_010)
    assert last_error(str(tmp_path)) == "local rank 1: DistBackendError: NCCL communicator was aborted"


def test_peer_failure_lines() -> None:
    assert is_peer_failure_line(GLOO)
    assert is_peer_failure_line("torch.distributed.DistNetworkError: Connection reset by peer")
    assert not is_peer_failure_line("NoCredentialsError: Unable to locate credentials")
    assert not is_peer_failure_line(
        "ValueError: the gloo of my model"
    )  # only RuntimeError carries the markers


def _raise_in_a_worker(tmp_path: Path, error: str) -> subprocess.CompletedProcess[str]:
    code = f"from goodput.job.folder import install_error_report; install_error_report(1); raise {error}"
    env = {
        **os.environ,
        "GOODPUT_LAUNCH_DIR": str(tmp_path),
        "TORCHELASTIC_ERROR_FILE": str(tmp_path / "e.json"),
    }
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_a_peers_reaction_after_a_fatal_verdict_prints_nothing(tmp_path: Path) -> None:
    (tmp_path / "FATAL").write_text("rank 0: AccessRefused: cannot write checkpoints to s3://b/r\n")
    done = _raise_in_a_worker(tmp_path, f"RuntimeError({GLOO.split(': ', 1)[1]!r})")
    assert done.returncode == 1 and done.stderr == ""
    info = json.loads((tmp_path / "e.json").read_text())["message"]["extraInfo"]
    assert info["goodput_peer_failure"] == "1" and "Connection closed by peer" in info["py_callstack"]
    (tmp_path / "e.json").unlink()
    own = _raise_in_a_worker(tmp_path, "ValueError('my own bug')")  # a rank's own error keeps its traceback
    assert "Traceback" in own.stderr and "my own bug" in own.stderr
    assert (
        json.loads((tmp_path / "e.json").read_text())["message"]["extraInfo"]["goodput_peer_failure"] == "0"
    )
