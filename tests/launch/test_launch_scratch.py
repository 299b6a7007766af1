"""The job's temporary folder (``goodput.launch.scratch``): what a SIGKILLed rank leaves in the temporary folder (its
own ``tempfile`` folders, Python multiprocessing's ``pymp-*``) is gone once the launch ends, and a SIGKILLed
launcher's folder is removed by the next launch. Real ``goodput launch`` jobs, real SIGKILLs; each test gives the
launcher a temporary folder of its own (``TMPDIR``) and looks at nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.launch.scratch import scratch_prefix
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


def _launch(tmp_path: Path, *script_args: str) -> subprocess.Popen[str]:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    (tmp_path / "out").mkdir(exist_ok=True)
    script = tmp_path / "leaves_temp.py"
    script.write_text(_SCRIPT)
    command = [sys.executable, "-m", "goodput", "launch", "--nproc", "1", "--max-restarts", "1"]
    command += ["--run-dir", str(tmp_path / "run"), "--", str(script), str(tmp_path / "out"), *script_args]
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_what_a_sigkilled_rank_leaves_in_the_temporary_folder_is_gone_when_the_launch_ends(
    tmp_path: Path,
) -> None:
    proc = _launch(tmp_path)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    first = (tmp_path / "out" / "attempt-0").read_text().splitlines()
    scratch, cache, left = first[0], first[1], first[2:]
    base = str(tmp_path / "tmp")
    assert os.path.dirname(scratch) == base and os.path.basename(scratch).startswith(scratch_prefix())
    assert all(path.startswith(scratch + os.sep) for path in left), (
        left
    )  # the rank's own, and multiprocessing's
    assert os.path.dirname(cache) == base  # torch.compile's cache stays where it was, to outlive the job
    assert not any(os.path.exists(path) for path in [scratch, *left])
    assert os.listdir(base) == [], os.listdir(base)


def test_a_sigkilled_launchers_temporary_folder_is_removed_by_the_next_launch(tmp_path: Path) -> None:
    killed = _launch(tmp_path, "wait")
    wait_for_file(str(tmp_path / "out" / "attempt-0"), killed)  # type: ignore[arg-type]
    scratch = (tmp_path / "out" / "attempt-0").read_text().splitlines()[0]
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate(timeout=60)  # its pipes close once its job has ended with it
    assert os.path.isdir(scratch)  # nobody was left to remove it
    (tmp_path / "out" / "attempt-0").unlink()
    again = _launch(tmp_path)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert not os.path.exists(scratch) and os.listdir(tmp_path / "tmp") == []
