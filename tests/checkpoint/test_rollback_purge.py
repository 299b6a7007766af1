"""A rollback and retention never remove the same checkpoint folder: each folder has one remover.

A commit starts retention's purge on a background thread; a rollback right after it (the numeric guard's, in
place) discards every checkpoint newer than its target. A folder older than the newest ``keep_last`` but newer
than the pinned target is on both lists. Real threads, real folders; the purge is held at its own fault point
by a ``slow`` fault (as a slow store would hold it), so the rollback comes while the purge is under way.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState
from goodput.faults import FaultPlan, install_faults, parse_faults


def test_a_rollback_during_a_purge_removes_each_folder_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = str(tmp_path / "ckpt")
    manager = _four_saved_then_keep_two(root, tmp_path)
    try:
        assert manager.restore_latest() == 4
        manager.pin(1)  # the rollback target: retention keeps it
        manager.save(5)  # its commit starts a purge of steps 3 and 2 (keep_last=2 keeps 5 and 4, the pin 1)
        with caplog.at_level(logging.WARNING, logger="goodput.checkpoint"):
            restored = manager.restore_latest(at_most=1)  # discards 5, 4, 3 and 2
            manager.close()
    finally:
        install_faults(None)
    assert restored == 1
    assert sorted(os.listdir(root)) == ["step-1"]  # no trash left behind either
    problems = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or "could not" in r.getMessage()
    ]
    assert problems == []


def test_the_last_commit_of_a_run_is_purged_after_even_while_a_purge_runs(tmp_path: Path) -> None:
    """A commit that lands while a purge is removing folders (it listed the root before that commit) is
    purged after too: the run's last commit has no later one whose purge would see it."""
    root = str(tmp_path / "ckpt")
    manager = _four_saved_then_keep_two(root, tmp_path)
    try:
        assert manager.restore_latest() == 4
        manager.save(5)  # its purge lists 1-5 and is held at its first removal (of 3, 2 and 1)
        manager.save(6)  # commits meanwhile: step 4 falls out of keep_last=2
        manager.close()
    finally:
        install_faults(None)
    assert sorted(os.listdir(root)) == ["step-5", "step-6"]


def _four_saved_then_keep_two(root: str, tmp_path: Path) -> CheckpointManager:
    """Steps 1-4 committed under ``root``; a manager that keeps the last 2, whose first purge removal is held
    2 s (a ``slow`` fault at its fault point, as a slow store would hold it). The caller uninstalls the fault."""
    model = torch.nn.Linear(8, 8)
    first = CheckpointManager(
        CheckpointConfig(root=root, strategy="torch_save", keep_last=10), TrainingState(model=model)
    )
    for step in (1, 2, 3, 4):
        first.save(step)
    first.close()
    manager = CheckpointManager(
        CheckpointConfig(root=root, strategy="torch_save", keep_last=2), TrainingState(model=model)
    )
    plan = parse_faults("slow@phase=checkpoint_purge,seconds=2")  # once: the first folder the purge removes
    install_faults(FaultPlan(plan, marker_dir=str(tmp_path / "faults")))
    return manager
