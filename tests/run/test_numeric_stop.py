"""The numeric guard's bounded stop: too many rollbacks within the window, and a fault that survives the skip of
its data, each stop the run with one line naming what was seen and tried, and the job with EXIT_NUMERIC."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import goodput as gp
from goodput.errors import NumericFault
from goodput.job.codes import EXIT_NUMERIC
from goodput.ledger.ledger import read_events
from tests.helpers.numeric import train_in_process
from tests.helpers.paths import script


def _train(run_dir: str, faults: str, numeric: gp.NumericConfig) -> list[int]:
    """A linear model's 20 steps in one process; the steps it finished, in order (redos included)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return train_in_process(run_dir, model, torch.randn(64, 4), steps=20, numeric=numeric, faults=faults)


def test_max_rollbacks_within_the_window_stop_the_run_in_one_line(tmp_path: Path) -> None:
    numeric = gp.NumericConfig(max_rollbacks=2, rollback_window=10, check_every=None)
    with pytest.raises(NumericFault) as stop:
        _train(str(tmp_path), "nan@step=5; nan@step=8; nan@step=11", numeric)
    line = str(stop.value)
    assert "\n" not in line and "nonfinite (the loss) at step 11" in line
    assert "rolled back from step 5 to 4; rolled back from step 8 to 7" in line
    assert "stopping: 2 rollbacks within 10 steps" in line and f"exit {EXIT_NUMERIC}" in line
    events = read_events(str(tmp_path), rank=0)
    assert [e["to_step"] for e in events if e["event"] == "rollback"] == [4, 7]
    (stopped,) = [e for e in events if e["event"] == "numeric_stop"]
    assert stopped["line"] == line


def test_rollbacks_further_apart_than_the_window_do_not_stop(tmp_path: Path) -> None:
    numeric = gp.NumericConfig(max_rollbacks=2, rollback_window=5, check_every=None)
    steps = _train(str(tmp_path), "nan@step=5; nan@step=11; nan@step=17", numeric)
    assert steps[-1] == 20 and steps.count(5) == steps.count(11) == steps.count(17) == 2


def test_a_fault_that_survives_the_skip_stops_the_job_with_exit_numeric(tmp_path: Path) -> None:
    """The same NaN three times at step 10: rolled back, rolled back and its window skipped, then it comes back
    on other data: the job stops with EXIT_NUMERIC and one line from the launcher (no restart)."""
    run_dir = os.path.join(tmp_path, "run")
    command = [sys.executable, "-m", "goodput", "launch", "--nproc", "2", "--run-dir", run_dir]
    command += ["--max-restarts", "2", "--faults", "nan@step=10,rank=1; " * 2 + "nan@step=10,rank=1", "--"]
    command += [script("numeric_train.py"), "--steps", "16"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == EXIT_NUMERIC, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("goodput launch:")]
    assert len(lines) == 3, proc.stderr[-3000:]  # each rollback, then the stop
    assert "rolled back to step" in lines[0] and "skipped the data of steps" in lines[1]
    assert "stopping: it survived skipping the data window" in lines[2] and "rank 1" in lines[2]
    events = read_events(run_dir, rank=0)
    assert [e["event"] for e in events if e["event"] in ("rollback", "skip", "numeric_stop")] == [
        "rollback", "rollback", "skip", "numeric_stop",
    ]  # fmt: skip
    assert len({e["attempt"] for e in events}) == 3  # no restart: the launcher did not requeue it
