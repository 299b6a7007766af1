"""Every rank of a warm generation judges a step from the same memory: real processes (gloo on CPU).

Rank 1 is SIGKILLed at step 30 and a hot spare takes its place; at step 33 every rank's loss is spiked 50x. The
spare has no loss history of its own, so its spike rule would be warming up while the survivor judges the step
from 30 steps of losses and calls a spike: one rank rolling back while the other trains on, and the job hung
(as it did before the survivors handed their window to the spare). Both must call it a spike and roll back, and
the job must complete.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from typing import Any

import pytest

from tests.helpers.launching import SCRIPTS, warm_launch

SCRIPT = os.path.join(SCRIPTS, "dropout_warm_train.py")


@pytest.mark.slow
def test_after_a_warm_restart_the_survivor_and_the_spare_call_a_spike_alike(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    faults = "kill@step=30,rank=1;spike@step=33,factor=50"
    cmd = [*warm_launch(run_dir), "--faults", faults, "--", SCRIPT, "--steps", "40", "--numeric"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warm hand-over to spare" in proc.stderr, proc.stderr[-3000:]
    verdicts: dict[int, list[str]] = {}
    for path in glob.glob(os.path.join(run_dir, "ledger", "attempt-*.rank-*.jsonl")):
        with open(path) as f:
            for e in map(json.loads, f):
                if e["event"] == "spike_missed" and e["step"] == 33:
                    verdicts.setdefault(e["rank"], []).append(e["why"])
                elif e["event"] == "numeric_fault":
                    verdicts.setdefault(e["rank"], []).append(f"fault: {e['kind']} at {e['step']}")
    assert sorted(verdicts) == [0, 1], verdicts
    assert verdicts[0] == verdicts[1] == ["fault: spike at 33"], verdicts  # the same verdict on both ranks
