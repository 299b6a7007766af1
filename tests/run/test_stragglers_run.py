"""The straggler detector in one process: a window's record of compute, wait and sections, and the scores that
reach the run's exporters (TensorBoard here; Prometheus in tests/integrations)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import goodput as gp
from goodput.ledger.ledger import read_events
from tests.helpers.exporting import run_with_exporter


def test_every_window_is_recorded_with_its_sections_and_its_scores_reach_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = str(tmp_path)
    exporter = gp.TensorBoardExporter(os.path.join(run_dir, "tensorboard"))
    run, model, opt, loader = run_with_exporter(run_dir, exporter, total_steps=20, every=100)
    for batch in run.batches(loader):
        # each section holds a sleep, so that its time stands clear of the scheduling noise of a loaded machine
        # (the window holds medians: a median of sums equals the sum of medians only when the noise is small)
        with run.section("forward"):
            loss = model(batch).pow(2).mean()
            time.sleep(0.01)
        with run.section("backward"):
            loss.backward()
            time.sleep(0.02)
        opt.step()
        opt.zero_grad()
        run.step_done(loss=loss.item())
    run.close()
    windows = [e for e in read_events(run_dir) if e["event"] == "straggler_window"]
    assert [(w["first_step"], w["last_step"]) for w in windows] == [(1, 5), (6, 10), (11, 15), (16, 20)]
    assert all(set(w["sections"]) == {"forward", "backward"} and w["scores"] == [1.0] for w in windows)
    assert all(
        w["compute"][0] == pytest.approx(sum(s[0] for s in w["sections"].values()), rel=0.5) for w in windows
    )
    events = EventAccumulator(os.path.join(run_dir, "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("goodput/straggler_score_rank0")] == [
        (5, 1.0), (10, 1.0), (15, 1.0), (20, 1.0)
    ]  # fmt: skip
