"""``goodput verify-rollback`` on a script: the drill's faults are found, rolled back and, for the NaN that comes
back, skipped, and the run ends bitwise as one that skipped the same samples from the start."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from goodput.verify.rollback import drill_plan
from tests.helpers.paths import script


def test_the_drill_places_a_flipped_bit_only_where_a_replica_check_sees_it() -> None:
    assert drill_plan(2000, 2) == (
        "nan@step=600,rank=1; nan@step=600,rank=1; spike@step=1100,factor=20; bitflip@step=1600,rank=0"
    )
    # under 2,000 steps the four rollbacks would stop the guard (3 within 1,000 steps): no spike beside a flip
    assert drill_plan(150, 2) == "nan@step=45,rank=1; nan@step=45,rank=1; bitflip@step=100,rank=0"
    # no check that agreed before the only one: nothing to roll a corrupted replica back to; a spike instead
    assert drill_plan(60, 2) == "nan@step=18,rank=1; nan@step=18,rank=1; spike@step=33,factor=20"
    assert "bitflip" not in drill_plan(2000, 1)  # nothing to compare with


def test_a_script_rolled_back_and_skipped_ends_as_one_that_skipped_from_the_start(
    tmp_path: os.PathLike[str],
) -> None:
    work = os.path.join(tmp_path, "work")
    command = [sys.executable, "-m", "goodput", "verify-rollback", "--nproc", "2", "--work-dir", work, "--"]
    command += [script("numeric_train.py"), "--steps", "120"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "clean: 120 steps, 0 alarms" in out
    for rung in ("found nonfinite (the loss) at step 36", "found sdc", "skipped steps"):
        assert rung in out, out
    assert "IDENTICAL" in out
    with open(os.path.join(work, "skipping", "numeric", "skips.json")) as f:
        assert json.load(f)  # the skip list the reference run started with
