"""No process and no temporary folder of ``goodput drill`` or ``goodput verify-resume`` outlives it: SIGTERM stops
the launch it runs (as goodput launch stops: its ranks save and end) and the command removes its temporary folder,
exiting 128 + 15; a command that completes leaves its temporary folder behind only with ``--keep``. (What torch
itself keeps in the temporary folder, its compile cache ``torchinductor_USER``, is any torch program's; so is
the ``pymp-*`` folder Python's multiprocessing makes for a process and cannot remove when a drill SIGKILLs it.)

Each command runs as a real process in a session of its own, with ``TMPDIR`` a folder of the test's, on a user's
script (tests/scripts/verify_user_train.py) made long enough to be signalled while it trains.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from goodput.drill.runs import processes_of
from goodput.job.signals import descendants
from tests.helpers.paths import script

SCRIPT = script("verify_user_train.py")
LONG = ("--", SCRIPT, "--steps", "100000")  # far longer than any test waits: it ends only when stopped


def _start(tmp: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "GOODPUT_RUN_DIR"}
    return subprocess.Popen(
        [sys.executable, "-m", "goodput", *args], env={**env, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _training(tmp: Path, proc: subprocess.Popen[str]) -> str:
    """The run folder of the command's first run, once a rank of it recorded a step (its workers train)."""
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        for records in glob.glob(os.path.join(tmp, "goodput-*", "*", "records", "*.jsonl")):
            if os.path.getsize(records):
                return os.path.dirname(os.path.dirname(records))
        time.sleep(0.1)  # polling for the first step, not a synchronisation by time
    proc.kill()
    raise AssertionError(f"no step recorded (exit {proc.poll()}): {proc.communicate()[1][-3000:]}")


def _left(tmp: Path) -> list[str]:
    """What is left in the temporary folder ``tmp`` besides torch's own cache."""
    return [name for name in os.listdir(tmp) if not name.startswith(("torchinductor_", "pymp-"))]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def _cleaned(proc: subprocess.Popen[str], pids: list[int]) -> Iterator[None]:
    """Whatever the test finds, leave no process of it behind."""
    try:
        yield
    finally:
        for pid in [proc.pid, *pids]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    "command", [("drill", "--scenarios", "rank,hang"), ("verify-resume", "--kills", "1")]
)
def test_sigterm_stops_the_launch_and_removes_the_temporary_folder(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    proc = _start(tmp_path, *command, *LONG)
    run_dir = _training(tmp_path, proc)
    job = descendants(proc.pid)  # the launch, torchrun (or the launch's supervision in verify) and the ranks
    with _cleaned(proc, job):
        assert processes_of(run_dir), "no rank of the run found"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
        assert f"goodput {command[0]}: stopped by SIGTERM" in err and "Traceback" not in err, err[-3000:]
        assert [pid for pid in job if _alive(pid)] == [] and processes_of(run_dir) == []
        assert _left(tmp_path) == [], "the temporary folder outlived the command"
        if command[0] == "drill":  # it said first how long it would take, the hang scenario's wait included
            start = next(line for line in err.splitlines() if line.startswith("it takes about"))
            assert "25 min the hang scenario waits" in start, start


@pytest.mark.slow
def test_a_drill_that_completes_leaves_no_temporary_folder_and_its_table_fits(tmp_path: Path) -> None:
    proc = _start(tmp_path, "drill", "--scenarios", "slow", "--", SCRIPT, "--steps", "8")
    with _cleaned(proc, []):
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    assert _left(tmp_path) == [], "the temporary folder outlived the drill"
    assert out.splitlines()[2].split()[:2] == ["slow", "yes"], out
    assert max(len(line) for line in out.splitlines()) <= 120, out


@pytest.mark.slow
def test_keep_keeps_the_temporary_folder_and_says_where(tmp_path: Path) -> None:
    proc = _start(tmp_path, "verify-resume", "--keep", "--kills", "1", "--", SCRIPT, "--steps", "12")
    with _cleaned(proc, []):
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    kept = glob.glob(os.path.join(tmp_path, "goodput-verify-*"))
    assert len(kept) == 1 and kept[0] in out, out
    assert sorted(os.listdir(kept[0])) == ["interrupted", "uninterrupted"]
