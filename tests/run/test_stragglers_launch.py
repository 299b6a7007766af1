"""The straggler detector over real torchrun gloo processes (``goodput launch``, DDP on 2 and 3 ranks): the rank
slowed by the user's own code (a sleep in its forward or its dataset) or by the persistent ``slow`` fault is named
with compute or data, its cost is charged to ``straggler_wait``, a clean run raises no alarm, ``stop=True`` exits
``EXIT_STRAGGLER``, and ``replace=True`` under warm restarts hands the slow rank to a hot spare that is not slow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from goodput.job.codes import EXIT_STRAGGLER
from goodput.ledger.ledger import read_events
from goodput.ledger.report import load_report

WORKER = os.path.join(
    os.path.dirname(__file__), "..", "..", "src", "goodput", "bench", "_straggler_worker.py"
)


def _launch(run_dir: str, nproc: int, *args: str, faults: str = "", warm: bool = False) -> subprocess.CompletedProcess[str]:  # fmt: skip
    command = [sys.executable, "-m", "goodput", "launch", "--nproc", str(nproc), "--run-dir", run_dir]
    if warm:
        command += ["--restart", "warm", "--spares", "1", "--max-restarts", "2"]
    if faults:
        command += ["--faults", faults]
    command += ["--", os.path.abspath(WORKER), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def _events(run_dir: str, name: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir, rank=None) if e.get("event") == name]


def test_a_slow_forward_of_one_rank_of_two_is_named_compute_and_charged_as_straggler_wait(
    tmp_path: Any,
) -> None:
    run_dir = str(tmp_path / "run")
    # a 30 ms forward slowed to 45 ms: the 15 ms stand clear of the scheduling noise of a loaded 2-core machine
    proc = _launch(run_dir, 2, "--steps", "30", "--base", "0.03", "--slow-rank", "1", "--factor", "1.5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    alarms = _events(run_dir, "straggler_alarm")
    assert [(a["straggler_rank"], a["kind"]) for a in alarms] == [(1, "compute")]
    # Named within the run; the issue's "within 20 steps at 1.5x" is `goodput bench stragglers`' figure, measured
    # alone: here another process may share the 2 cores, and one noisy window restarts the count of 3.
    assert alarms[0]["step"] <= 30
    report = load_report(run_dir)
    assert report.accounting.categories["straggler_wait"] > 0.0
    assert "rank 1 on host" in report.render() and any(a.kind == "straggler" for a in report.advice)


def test_a_slow_dataset_of_one_rank_of_three_is_named_data(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    proc = _launch(
        run_dir,
        3,
        "--steps",
        "30",
        "--base",
        "0.03",
        "--slow-rank",
        "2",
        "--slow-in",
        "data",
        "--factor",
        "1.5",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(a["straggler_rank"], a["kind"]) for a in _events(run_dir, "straggler_alarm")] == [(2, "data")]


def test_a_clean_run_raises_no_alarm(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    proc = _launch(run_dir, 2, "--steps", "60")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(_events(run_dir, "straggler_window")) == 12
    assert _events(run_dir, "straggler_alarm") == []


def test_stop_ends_the_job_with_its_own_exit_code(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    proc = _launch(run_dir, 2, "--steps", "60", "--stop", faults="slow@rank=1,factor=2,persist")
    assert proc.returncode == EXIT_STRAGGLER, proc.stderr[-3000:]
    assert "straggler: rank 1 on host" in proc.stderr


def test_replace_hands_the_slow_rank_to_a_hot_spare_that_is_not_slowed(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    proc = _launch(run_dir, 2, "--steps", "60", "--replace", faults="slow@rank=1,factor=2,persist", warm=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [a["straggler_rank"] for a in _events(run_dir, "straggler_alarm")] == [1]  # the spare stays fast
    reasons = [e.get("reason", "") for e in _events(run_dir, "failure_detected")]
    assert any("StragglerReplaced" in r and "hot spare" in r for r in reasons), reasons
    assert _events(run_dir, "warm_restart")
    ends = [e["step"] for e in _events(run_dir, "step_end") if e.get("rank") == 0]
    assert max(ends) == 60


def test_fsdp2_a_slow_forward_of_one_rank_of_two_is_named_compute(tmp_path: Any) -> None:
    """FSDP2: the fast rank's wait is its time inside FSDP2's all-gathers and reduce-scatters (timed through
    its custom-collective setters), not its own compute."""
    run_dir = str(tmp_path / "run")
    proc = _launch(run_dir, 2, "--steps", "30", "--slow-rank", "1", "--factor", "2", "--fsdp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(a["straggler_rank"], a["kind"]) for a in _events(run_dir, "straggler_alarm")] == [(1, "compute")]
    windows = _events(run_dir, "straggler_window")
    assert sum(w["wait"][0] for w in windows) > sum(w["wait"][1] for w in windows)  # the fast rank waited


def test_the_demo_with_a_slow_rank_reports_a_straggler_section(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "demo")
    command = [sys.executable, "-m", "goodput", "demo", "--run-dir", run_dir, "--steps", "60", "--no-faults"]
    command += ["--restart", "cold", "--strategy", "torch_save", "--every", "1000", "--slow-rank", "1"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stragglers:" in proc.stdout and "rank 1 on host" in proc.stdout, proc.stdout[-3000:]
    assert [a["straggler_rank"] for a in _events(run_dir, "straggler_alarm")] == [1]
