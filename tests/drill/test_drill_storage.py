"""The storage drill scenarios: ``storage-full`` on a user's script through ``goodput drill`` (a small tmpfs runs
out of space mid-save, room comes back), and ``storage-slow``, ``throttled``, ``flaky`` against the drill's own
script (checkpoints on the real S3 server behind the fault proxy, a SIGKILL after the second save). Each must
meet its documented outcome: completed, every sample once, final state identical."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.drill.objectstore import queued_saves
from goodput.drill.scenario import Reference, registered
from goodput.ledger import read_events
from goodput.ledger.report import load_report
from tests.helpers import drill
from tests.helpers.paths import script

pytestmark = pytest.mark.slow


def _steps(run_dir: Path, name: str) -> list[int]:
    events = read_events(str(run_dir), rank=None)
    return sorted({int(e["step"]) for e in events if e["event"] == name and e.get("step") is not None})


def test_storage_full_on_a_users_script_fails_one_save_trains_on_and_ends_identical(tmp_path: Path) -> None:
    work = tmp_path / "drill"
    command = [sys.executable, "-m", "goodput", "drill", "--scenarios", "storage-full", "--json",
               "--work-dir", str(work), "--", script("verify_user_train.py"), "--steps", "16"]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if "cannot mount a tmpfs" in proc.stdout:
        pytest.skip("mounting a tmpfs is not permitted here")
    row = json.loads(proc.stdout)["scenarios"]["storage-full"]
    assert proc.returncode == 0 and row["met"], row
    assert (row["outcome"], row["exactly_once"], row["identical"]) == ("completed", True, True)
    run_dir = work / "storage-full" / "run"
    failed, durable = _steps(run_dir, "checkpoint_failed"), _steps(run_dir, "checkpoint_durable")
    assert failed[0] == 8 and durable[0] == 4 and durable[-1] == 16, (
        failed,
        durable,
    )  # the second save failed
    # it trained on past it (the scenario checks); the final save at close may still find the disk full when
    # the steps outrun the drill's remount: that attempt then ends with an error and one restart redoes it
    assert load_report(str(run_dir)).accounting.restarts <= 1
    log = (run_dir / "output.log").read_text()
    assert log.count("saving step 8 failed") == 2 and "No space left on device" in log  # a warning a rank
    assert not os.path.ismount(work / "storage-full" / "disk")  # the drill unmounted its tmpfs


@pytest.mark.s3
@pytest.mark.parametrize("name", ["storage-slow", "throttled", "flaky"])
def test_a_faulty_object_store_costs_time_and_nothing_else(
    drill_reference: Reference, tmp_path: Path, name: str
) -> None:
    # A throttled request is retried with backoff (botocore: up to 5 tries, ~1+2+4+8 s of jitter at worst), so a
    # save through a store answering 503 bursts can pass the 20 s the script's 5 s hang timeout allows a save on
    # a loaded machine; a hang declared there is the drill's timeout, not the store's fault.
    outcome = registered()[name].run(drill.context(str(tmp_path), drill_reference, hang_timeout=30))
    assert outcome.met, outcome
    # identical too: the store's retries draw from the client's own generator, not the script's `random`
    assert outcome.outcome == "completed" and outcome.exactly_once and outcome.identical is True
    run_dir = tmp_path / "run"
    assert _steps(run_dir, "checkpoint_failed") == [] and queued_saves(str(run_dir)) == []
    restored = _steps(run_dir, "restore_end")  # the restart read a save through the proxy (the kill: step 9)
    assert len(restored) == 1 and restored[0] in (4, 8), restored
    acc = load_report(str(run_dir)).accounting
    assert acc.restarts == 1 and acc.categories["failure_detection"] == 0.0  # the SIGKILL's; no hang declared
    assert not outcome.injected.startswith("none"), outcome.injected


@pytest.mark.parametrize("queued", [False, True])
def test_a_save_that_waits_for_the_one_in_flight_is_not_read_as_queued(tmp_path: Path, queued: bool) -> None:
    """A save's stall span opens at the call, so it may open before the previous save is durable: that save
    waited (its wait charged as its stall). It queued only when its own part ended with the earlier one still
    in flight."""
    from goodput.ledger import Ledger

    with Ledger(str(tmp_path), rank=0) as ledger:
        ledger.on_event("checkpoint_stall", phase="start", step=4)
        ledger.on_event("checkpoint_stall", phase="end", step=4, seconds=0.1)
        ledger.on_event("checkpoint_stall", phase="start", step=8)  # step 4 still uploading
        if not queued:
            ledger.on_event("checkpoint_durable", step=4)  # the save of step 8 waited for it
        ledger.on_event("checkpoint_stall", phase="start", step=8, tier="memory")  # the memory tier's own
        ledger.on_event("checkpoint_stall", phase="end", step=8, seconds=0.2)
        ledger.on_event("checkpoint_durable", step=8)
    assert queued_saves(str(tmp_path)) == ([8] if queued else [])
