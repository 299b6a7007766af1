"""What the launch terminal shows of the numeric guard: one line per numeric event (what was found and where, the
step and tier it rolled back to, the data it skipped, a rank named corrupt), and none of the rollback's
checkpoint-by-checkpoint detail, which stays in the workers' logs."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from pathlib import Path

from goodput.ledger.ledger import read_events
from tests.helpers.launching import terminal_lines
from tests.helpers.paths import script


def test_each_numeric_event_is_one_line_on_the_launch_terminal(tmp_path: Path) -> None:
    """A NaN that comes back on its redo (rolled back, then rolled back with its data skipped) and a flipped bit
    (rolled back past a durable checkpoint, which is discarded; the redo names the rank)."""
    run_dir = str(tmp_path / "run")
    faults = "nan@step=10,rank=1; nan@step=10,rank=1; bitflip@step=14,rank=0"
    command = [sys.executable, "-m", "goodput", "launch", "--nproc", "2", "--run-dir", run_dir]
    command += ["--faults", faults, "--", script("numeric_train.py"), "--steps", "24"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    terminal = terminal_lines(proc.stdout + proc.stderr)
    events = read_events(run_dir, rank=0)
    rollbacks = [e for e in events if e["event"] == "rollback"]
    (skip,) = [e for e in events if e["event"] == "skip"]
    (named,) = [e for e in events if e["event"] == "sdc_named"]
    assert [e["kind"] for e in rollbacks] == ["nonfinite", "nonfinite", "sdc"]
    assert len(terminal) == len(rollbacks) + 1, terminal
    assert all(line.startswith("goodput launch: numeric fault: ") for line in terminal), terminal
    told = [line for line in terminal if "rolled back" in line]
    for line, e in zip(told, rollbacks, strict=True):
        assert re.search(rf"at step {e['from_step']}\b", line), line
        assert f"rolled back to step {e['to_step']} ({e['tier']} tier)" in line
    assert (
        f"skipped the data of steps {skip['first_step']}-{skip['last_step']} ({skip['samples']} samples)"
        in told[1]
    )
    assert "skipped" not in told[0] + told[2]
    (naming,) = [line for line in terminal if "named corrupt" in line]
    assert f"rank {named['named_rank']} named corrupt at step {named['step']}" in naming
    # The rollback of the flipped bit discarded the newer durable checkpoint: said in the worker's log only.
    pattern = os.path.join(run_dir, "launches", "*", "logs", "**", "stderr.log")
    logs = "".join(Path(p).read_text() for p in glob.glob(pattern, recursive=True))
    assert "rollback: discarding checkpoint" in logs
