"""goodput deletes only what it can prove it wrote: hand-made step folders survive start-up cleaning, and a
save never replaces one."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState, list_checkpoints
from goodput.errors import SaveFailed


def _manager(root: Path) -> CheckpointManager:
    config = CheckpointConfig(root=str(root), strategy="dcp", every=1, partial_grace="1s")
    return CheckpointManager(config, TrainingState(model=torch.nn.Linear(2, 2)))


def test_resuming_leaves_hand_made_step_folders_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = _manager(tmp_path)
    first.save(50)
    first.close()
    notes = tmp_path / "step-60"
    notes.mkdir()
    (notes / "notes.txt").write_text("my analysis of step 60")
    (tmp_path / "step-70").mkdir()
    with caplog.at_level(logging.WARNING):
        again = _manager(tmp_path)  # start-up cleaning runs here
        assert again.restore_latest() == 50
        again.close()
    assert (notes / "notes.txt").read_text() == "my analysis of step 60"
    assert (tmp_path / "step-70").is_dir()
    assert f"leaving {notes} alone" in caplog.text


def test_a_save_never_replaces_a_folder_goodput_did_not_write(tmp_path: Path) -> None:
    hand_made = tmp_path / "step-3"
    hand_made.mkdir()
    (hand_made / "notes.txt").write_text("mine")
    manager = _manager(tmp_path)
    manager.save(2)
    with pytest.raises(SaveFailed, match=r"step-3 exists and was not written by goodput"):
        manager.save(3)
    manager.save(4)  # training and saving go on
    manager.close()
    assert (hand_made / "notes.txt").read_text() == "mine"
    rows = {(r.step, r.status) for r in list_checkpoints(str(tmp_path))}
    assert rows == {(2, "committed"), (3, "partial"), (4, "committed")}
