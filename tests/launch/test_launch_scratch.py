"""The job's temporary folder (``goodput.launch.scratch``): what a SIGKILLed rank leaves in the temporary folder (its
own ``tempfile`` folders, Python multiprocessing's ``pymp-*``) is gone once the launch ends, and a SIGKILLed
launcher's folder is removed by the next launch, and under a ``TMPDIR`` too long for one more level the job keeps
the user's, so that a DataLoader's workers can still bind their sockets. Real ``goodput launch`` jobs, real
SIGKILLs; each test gives the launcher a temporary folder of its own (``TMPDIR``, short: pytest's own is too long
for a job folder inside it) and looks at nothing else."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from goodput.launch.scratch import SOCKET_PATH_MAX, SOCKET_ROOM, scratch_prefix
from tests.helpers.launching import wait_for_file

pytestmark = pytest.mark.slow

# Leaves a tempfile folder and multiprocessing's own (a DataLoader's worker pool makes that one), says where,
# then dies by SIGKILL in the first attempt; the second ends cleanly. With a second argument it waits, killed.
_SCRIPT = """
import multiprocessing.util, os, signal, sys, tempfile, time
out, attempt = sys.argv[1], int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
left = [tempfile.mkdtemp(prefix="left-"), multiprocessing.util.get_temp_dir()]
cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
with open(os.path.join(out, f"attempt-{attempt}.tmp"), "w") as f:
    f.write("\\n".join([os.environ["TMPDIR"], cache, *left]))
os.replace(os.path.join(out, f"attempt-{attempt}.tmp"), os.path.join(out, f"attempt-{attempt}"))
if len(sys.argv) > 2:
    time.sleep(600)
if attempt == 0:
    os.kill(os.getpid(), signal.SIGKILL)
"""


# A DataLoader whose workers pass tensors back: each one binds multiprocessing's Unix socket in TMPDIR.
_LOADER = """
import os, sys, torch
from torch.utils.data import DataLoader, TensorDataset
total = sum(int(b.sum()) for (b,) in DataLoader(TensorDataset(torch.arange(64)), batch_size=8, num_workers=2))
with open(os.path.join(sys.argv[1], "attempt-0"), "w") as f:
    f.write(f"{os.environ['TMPDIR']}\\n{total}")
"""


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="gpt-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _launch(tmp_path: Path, tmp: Path, *script_args: str, script: str = _SCRIPT) -> subprocess.Popen[str]:
    tmp.mkdir(exist_ok=True)
    (tmp_path / "out").mkdir(exist_ok=True)
    path = tmp_path / "script.py"
    path.write_text(script)
    command = [sys.executable, "-m", "goodput", "launch", "--nproc", "1", "--max-restarts", "1"]
    command += ["--run-dir", str(tmp_path / "run"), "--", str(path), str(tmp_path / "out"), *script_args]
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_what_a_sigkilled_rank_leaves_in_the_temporary_folder_is_gone_when_the_launch_ends(
    tmp_path: Path, short_tmp: Path
) -> None:
    proc = _launch(tmp_path, short_tmp)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    first = (tmp_path / "out" / "attempt-0").read_text().splitlines()
    scratch, cache, left = first[0], first[1], first[2:]
    base = str(short_tmp)
    assert os.path.dirname(scratch) == base and os.path.basename(scratch).startswith(scratch_prefix())
    assert all(path.startswith(scratch + os.sep) for path in left), (
        left
    )  # the rank's own, and multiprocessing's
    assert os.path.dirname(cache) == base  # torch.compile's cache stays where it was, to outlive the job
    assert not any(os.path.exists(path) for path in [scratch, *left])
    assert os.listdir(base) == [], os.listdir(base)


def test_a_sigkilled_launchers_temporary_folder_is_removed_by_the_next_launch(
    tmp_path: Path, short_tmp: Path
) -> None:
    killed = _launch(tmp_path, short_tmp, "wait")
    wait_for_file(str(tmp_path / "out" / "attempt-0"), killed)  # type: ignore[arg-type]
    scratch = (tmp_path / "out" / "attempt-0").read_text().splitlines()[0]
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate(timeout=60)  # its pipes close once its job has ended with it
    assert os.path.isdir(scratch)  # nobody was left to remove it
    (tmp_path / "out" / "attempt-0").unlink()
    again = _launch(tmp_path, short_tmp)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert not os.path.exists(scratch) and os.listdir(short_tmp) == []


def test_under_a_temporary_folder_too_long_for_one_more_level_a_loaders_workers_still_bind_their_sockets(
    tmp_path: Path, short_tmp: Path
) -> None:
    # Short enough for multiprocessing's socket (32 bytes below it) to fit, too long for it a job folder deeper.
    length = SOCKET_PATH_MAX - SOCKET_ROOM
    tmp = short_tmp / ("x" * (length - len(str(short_tmp)) - 1))
    assert len(str(tmp)) == length
    proc = _launch(tmp_path, tmp, script=_LOADER)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the loader's workers hung: their socket could not be bound") from None
    assert proc.returncode == 0, err[-3000:]
    seen, total = (tmp_path / "out" / "attempt-0").read_text().splitlines()
    assert seen == str(tmp) and int(total) == sum(range(64))  # the user's folder, every sample loaded
