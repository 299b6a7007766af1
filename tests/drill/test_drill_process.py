"""The drill's process scenarios against real processes (``goodput launch``, 2 gloo ranks, SIGKILL, SIGTERM):
``rank``, ``hang`` and ``preempt``. Each replaces a test that checked the same promise on the demo LM
(test_chaos's ten SIGKILLs and hung rank, test_preemption's SIGTERM to the launcher)."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.drill.scenario import Reference, registered
from goodput.ledger import read_events
from goodput.ledger.report import load_report
from tests.helpers import drill

pytestmark = pytest.mark.slow

HANG_TIMEOUT = 3.0


def test_rank_sigkills_at_steps_and_inside_saves_uploads_and_restores_change_nothing(
    drill_reference: Reference, tmp_path: Path
) -> None:
    context = drill.context(str(tmp_path), drill_reference)
    result = registered()["rank"].run(context)
    assert result.met, result
    assert result.exactly_once and result.identical
    for phase in ("checkpoint_write", "async_upload", "restore"):
        assert f"phase={phase}" in result.injected, result.injected
    run_dir = str(tmp_path / "run")
    restored = [e["step"] for e in read_events(run_dir) if e["event"] == "restore_end" and e.get("step")]
    assert restored and all(step in drill_reference.saves for step in restored), restored
    acc = load_report(run_dir).accounting
    assert acc.restarts >= 4 and acc.categories["lost_work"] > 0
    assert sum(acc.categories.values()) == pytest.approx(acc.wall_seconds, rel=0.01)


def test_hang_inside_a_step_and_entering_a_save_is_detected_and_recovered(
    drill_reference: Reference, tmp_path: Path
) -> None:
    # Each hang costs its timeout (4x inside a save): a 3 s timeout instead of the script's 5 s (the steps take
    # milliseconds, so no rank that trains comes near it).
    context = drill.context(str(tmp_path), drill_reference, hang_timeout=HANG_TIMEOUT)
    result = registered()["hang"].run(context)
    assert result.met, result
    detected = [e for e in read_events(str(tmp_path / "run"), rank=None) if e["event"] == "failure_detected"]
    silent = sorted(float(e["silent_seconds"]) for e in detected if e["reason"].startswith("hang"))
    assert silent and HANG_TIMEOUT <= silent[0] < HANG_TIMEOUT + 5, silent  # the timeout, and no later
    assert load_report(str(tmp_path / "run")).accounting.categories["failure_detection"] > 0


def test_preempt_sigterm_and_the_schedulers_signal_save_once_and_the_relaunch_resumes_exactly(
    drill_reference: Reference, tmp_path: Path
) -> None:
    result = registered()["preempt"].run(drill.context(str(tmp_path), drill_reference))
    assert result.met, result
    # each signal lands in a pause at a step of the run, before the ranks' check there: both are acted on
    assert result.injected == (
        "SIGTERM at step 1: stopped, exit 75, saved [2]; SIGUSR1 at step 3: stopped, exit 75, saved [4]"
    ), result.injected
    # the preemptions are no failures, and each relaunch is a new launch: its wait is not restart downtime
    data = load_report(str(tmp_path / "run")).to_dict()
    assert (data["failures"], data["preemptions"], data["launches"], data["restarts"]) == (0, 2, 3, 0)
    assert data["categories"]["restart_downtime"] == 0.0 and data["categories"]["between_launches"] > 0.0
