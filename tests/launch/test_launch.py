"""goodput launch over real torchrun: restarts after SIGKILLs reach a working gloo group; crash loops stop."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from goodput.errors import ConfigError
from goodput.job.codes import EXIT_CRASH_LOOP, EXIT_FATAL
from goodput.job.crashloop import attempt_records
from goodput.launch.launcher import LaunchConfig, torchrun_command
from goodput.ledger import read_events
from tests.helpers.launching import WORKER
from tests.helpers.paths import script


def _goodput(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "goodput", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_restarts_after_sigkills_rejoin_a_fresh_group(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    proc = _goodput(
        "launch",
        "--nproc",
        "2",
        "--max-restarts",
        "3",
        "--run-dir",
        run_dir,
        "--",
        script("restart_worker.py"),
        "2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        with open(os.path.join(run_dir, f"done-rank{rank}.json")) as f:
            done = json.load(f)
        # Two attempts were killed; the third (attempt 2) finished with a working all-reduce.
        assert done == {"attempt": 2, "sum": 3.0, "world": 2}


@pytest.mark.slow
def test_crash_loop_stops_torchrun_with_its_own_exit_code(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    worker = script("crashloop_worker.py")
    proc = _goodput("launch", "--max-restarts", "8", "--crash-loop", "2", "--run-dir", run_dir, "--", worker)
    assert proc.returncode == EXIT_CRASH_LOOP, proc.stderr[-3000:]
    assert "crash loop: the last 2 attempts made no progress" in proc.stderr
    # Attempt 2 (after attempts 0 and 1 failed) gave the verdict; torchrun may start an attempt or two more
    # while the launcher reacts, but it stops long before the 8 restarts run out.
    attempts = attempt_records(run_dir)
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


def test_a_multi_node_rendezvous_waits_rdzv_timeout_not_torchruns_600s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def conf(**kwargs: Any) -> str:
        config = LaunchConfig(script=("t.py",), nnodes="2", rdzv_endpoint="127.0.0.1:29400", **kwargs)
        return next(arg for arg in torchrun_command(config) if arg.startswith("--rdzv-conf="))

    monkeypatch.delenv("PET_RDZV_CONF", raising=False)
    assert conf() == "--rdzv-conf=join_timeout=300,read_timeout=60"
    assert conf(rdzv_timeout=12.5) == "--rdzv-conf=join_timeout=13,read_timeout=13"
    # torchrun's own variable, which the command-line flag would hide, keeps what it sets
    monkeypatch.setenv("PET_RDZV_CONF", "last_call_timeout=10,join_timeout=900")
    assert conf() == "--rdzv-conf=last_call_timeout=10,join_timeout=900,read_timeout=60"
    with pytest.raises(ConfigError, match="--rdzv-timeout must be at least 1 second"):
        conf(rdzv_timeout=0)


def test_torchrun_runs_an_existing_script_behind_the_gc_boot(tmp_path: os.PathLike[str]) -> None:
    script = os.path.join(tmp_path, "train.py")
    open(script, "w").close()
    cmd = torchrun_command(LaunchConfig(script=(script, "--lr", "3"), nproc=2))
    assert cmd[-5:] == ["--module", "goodput.warm.boot", script, "--lr", "3"]


# ---- crash loops, errors a restart cannot fix, one run folder, plans that cannot fire ----------------------
def _launch(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return _goodput("launch", *args, timeout=timeout)


def _lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("goodput launch:")]


@pytest.mark.slow
def test_crash_loop_then_fix_then_relaunch_into_the_same_folder_completes(tmp_path: os.PathLike[str]) -> None:
    run_dir = os.path.join(tmp_path, "run")
    broken = os.path.join(tmp_path, "broken")
    with open(broken, "w") as f:
        f.write("remove me to fix the job")
    args = ("--max-restarts", "6", "--crash-loop", "2", "--run-dir", run_dir, "--", WORKER, "--steps", "6")
    stopped = _launch(*args, "--broken", broken)
    assert stopped.returncode == EXIT_CRASH_LOOP, stopped.stderr[-3000:]
    line = _lines(stopped.stderr)[-1]  # after one line per failure
    assert "crash loop: the last 2 attempts made no progress" in line
    assert f"RuntimeError: broken input: {broken} exists" in line  # the failing rank's last error, quoted
    os.remove(broken)  # the fix
    fixed = _launch(*args, "--broken", broken)
    assert fixed.returncode == 0, fixed.stderr[-3000:]  # earlier launches' attempts do not count
    with open(os.path.join(run_dir, "finished")) as f:
        assert f.read() == "6"
    verdicts = glob.glob(os.path.join(run_dir, "launches", "*", "CRASH_LOOP"))
    assert len(verdicts) == 1  # the old verdict stays in the run's history


@pytest.mark.slow
def test_an_error_a_restart_cannot_fix_stops_the_job_at_once(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    proc = _launch("--max-restarts", "5", "--run-dir", run_dir, "--", WORKER, "--fatal")
    assert proc.returncode == EXIT_FATAL, proc.stderr[-3000:]
    (line,) = _lines(proc.stderr)
    assert "rank 0: ConfigError: the learning rate schedule needs warmup_steps" in line
    assert "Traceback" not in proc.stderr
    restarts = [e for e in read_events(run_dir) if e["event"] == "attempt_start"]
    assert len(restarts) <= 2  # stopped at the first failure (a second attempt may start while it reacts)


@pytest.mark.slow
def test_checkpoints_that_all_fail_to_load_stop_the_job_unless_a_fresh_start_is_allowed(
    tmp_path: os.PathLike[str],
) -> None:
    run_dir = str(tmp_path)
    first = _launch("--run-dir", run_dir, "--", WORKER, "--every", "2", "--steps", "4")
    assert first.returncode == 0, first.stderr[-3000:]
    os.remove(os.path.join(run_dir, "finished"))
    shards = glob.glob(os.path.join(run_dir, "checkpoints", "step-*", "*.distcp"))
    assert len(shards) == 2  # steps 2 and 4, one rank each
    for shard in shards:
        with open(shard, "r+b") as f:
            f.truncate(10)
    longer = ("--", WORKER, "--every", "2", "--steps", "6")
    stopped = _launch("--max-restarts", "3", "--run-dir", run_dir, *longer)
    assert stopped.returncode == EXIT_FATAL, stopped.stderr[-3000:]
    (line,) = _lines(stopped.stderr)
    assert "rank 0: NoValidCheckpoint: none of the 2 committed checkpoints under" in line
    assert "newest failure: step 4:" in line and "--allow-fresh-start" in line
    assert "Traceback" not in stopped.stderr and "skipping checkpoint" not in stopped.stderr
    assert not os.path.exists(os.path.join(run_dir, "finished"))  # nothing was trained
    allowed = _launch("--allow-fresh-start", "--run-dir", run_dir, *longer)
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    with open(os.path.join(run_dir, "finished")) as f:
        assert f.read() == "6"
    restored = [e.get("step") for e in read_events(run_dir) if e["event"] == "restore_end"]
    assert restored[-1] is None  # trained from step 1


@pytest.mark.slow
def test_a_script_that_names_another_run_folder_is_stopped(tmp_path: os.PathLike[str]) -> None:
    drill, other = os.path.join(tmp_path, "drill"), os.path.join(tmp_path, "exp1")
    proc = _launch("--run-dir", drill, "--", WORKER, "--run-dir", other)
    assert proc.returncode == EXIT_FATAL, proc.stderr[-3000:]
    (line,) = _lines(proc.stderr)
    assert f"Run({other!r}) is not the run folder goodput launch --run-dir gave ({drill})" in line
    assert not os.path.exists(other)  # nothing was trained or resumed there


@pytest.mark.slow
def test_a_launch_into_a_complete_run_says_so_and_trains_nothing(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    first = subprocess.run(
        [sys.executable, WORKER, "--run-dir", run_dir, "--steps", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    proc = _launch("--run-dir", run_dir, "--faults", "kill@step=2", "--", WORKER, "--steps", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"goodput: {run_dir} is already complete (step 4 of 4): nothing to train" in proc.stderr
    events = read_events(run_dir)
    assert [e["step"] for e in events if e["event"] == "step_end"] == [1, 2, 3, 4]  # none trained again
    assert not any(e["event"] == "fault_injected" for e in events)


def test_a_fault_that_can_never_fire_is_refused_before_the_run(tmp_path: os.PathLike[str]) -> None:
    proc = _launch("--nproc", "2", "--faults", "kill@step=3,rank=2", "--", "train.py", timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "kill@step=3,rank=2 can never fire: rank 2 does not exist in a job of 2 ranks" in proc.stderr
    # A step past the run's end is known only to the script's Run: refused there, in one line, exit 2.
    env = dict(os.environ, GOODPUT_FAULTS="raise@step=500")
    script = subprocess.run(
        [sys.executable, WORKER, "--run-dir", str(tmp_path), "--steps", "20"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert script.returncode == 2, script.stderr
    assert script.stderr.strip() == (
        "goodput: rank 0: ConfigError: fault raise@step=500 can never fire: step 500 is past the run's last step 20"
    )


def test_a_run_folder_that_is_a_file_is_one_line(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "file")
    with open(path, "w") as f:
        f.write("not a folder")
    proc = _launch("--run-dir", path, "--", "train.py", timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is a file" in proc.stderr, proc.stderr


def test_run_refuses_a_folder_other_than_the_launchers(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from goodput.run._setup import resolve_run_dir

    monkeypatch.setenv("GOODPUT_RUN_DIR", os.path.join(tmp_path, "drill"))
    assert resolve_run_dir(os.path.join(tmp_path, "drill", ".")) == os.path.join(tmp_path, "drill", ".")
    assert resolve_run_dir(None) == os.path.join(tmp_path, "drill")
    with pytest.raises(ConfigError, match="is not the run folder goodput launch --run-dir gave"):
        resolve_run_dir(os.path.join(tmp_path, "exp1"))


@pytest.mark.slow
def test_a_rank_failing_before_the_checkpoint_collectives_restarts_the_job_promptly(
    tmp_path: os.PathLike[str],
) -> None:
    run_dir = str(tmp_path)
    # Rank 1 fails as it enters the save of step 5 while rank 0 is inside DCP's planning collective. With a
    # 10 s hang timeout the watchdog would end the waiting rank after 40 s (4x inside a save) and record a hang.
    proc = _launch(
        "--nproc", "2", "--max-restarts", "2", "--run-dir", run_dir,
        "--faults", "raise@phase=checkpoint_begin,step=5,rank=1",
        "--", WORKER, "--steps", "8", "--every", "5", "--hang-timeout", "10",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = read_events(run_dir, rank=None)
    assert not [e for e in events if e["event"] == "failure_detected"]  # no rank waited for the watchdog
    failed = [e for e in events if e["event"] == "checkpoint_failed"]
    assert any(e["rank"] == 1 and "InjectedFault" in e["error"] for e in failed)
    assert sorted({e["attempt"] for e in events if e["event"] == "attempt_start"}) == [0, 1]  # one restart
    with open(os.path.join(run_dir, "finished")) as f:
        assert f.read() == "8"
