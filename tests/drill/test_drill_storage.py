"""The storage drill scenarios against the drill's own script, each against one uninterrupted reference run:
``storage-full`` (a small tmpfs runs out of space mid-save, room comes back) and ``storage-slow``,
``throttled``, ``flaky`` (checkpoints on the real S3 server behind the fault proxy, a SIGKILL after the first
save). Each must meet its documented outcome: completed, every sample once, final state identical."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from goodput.drill.scenario import Reference, ScenarioResult, registered
from goodput.ledger import read_events
from tests.helpers import drill

pytestmark = pytest.mark.slow


def _drill(name: str, reference: Reference, work: Path) -> ScenarioResult:
    return registered()[name].run(drill.context(str(work), reference))


def _events(run_dir: Path, name: str) -> list[int]:
    events = read_events(str(run_dir), rank=None)
    return sorted({int(e["step"]) for e in events if e["event"] == name and e.get("step") is not None})


def test_storage_full_fails_one_save_trains_on_and_ends_identical(
    drill_reference: Reference, tmp_path: Path
) -> None:
    outcome = _drill("storage-full", drill_reference, tmp_path / "full")
    if any("cannot mount a tmpfs" in p for p in outcome.problems):
        pytest.skip(outcome.problems[0])
    assert outcome.met, outcome
    assert outcome.outcome == "completed" and outcome.exactly_once and outcome.identical
    run_dir = tmp_path / "full" / "run"
    failed, durable = _events(run_dir, "checkpoint_failed"), _events(run_dir, "checkpoint_durable")
    assert failed and durable[0] < failed[0] < durable[-1]  # a checkpoint before; a later one committed
    log = (run_dir / "output.log").read_text()
    assert log.count(f"saving step {failed[0]} failed") == 2  # one warning on each of the 2 ranks
    assert not os.path.ismount(tmp_path / "full" / "disk")  # the drill unmounted its tmpfs


@pytest.mark.s3
@pytest.mark.parametrize("name", ["storage-slow", "throttled", "flaky"])
def test_a_faulty_object_store_costs_time_and_nothing_else(
    drill_reference: Reference, tmp_path: Path, name: str
) -> None:
    outcome = _drill(name, drill_reference, tmp_path / name)
    assert outcome.met, outcome
    assert outcome.outcome == "completed" and outcome.exactly_once and outcome.identical
    run_dir = tmp_path / name / "run"
    assert _events(run_dir, "checkpoint_failed") == []
    restored = _events(run_dir, "restore_end")
    assert (
        restored and restored[-1] in drill_reference.saves
    )  # the restart read a checkpoint through the proxy
    assert "injected over the run" in outcome.injected and not outcome.injected.startswith("none")
