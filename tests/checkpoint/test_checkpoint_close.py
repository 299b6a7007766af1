"""CheckpointManager.close: the final step is saved when given, a forgotten one is named, and single-process
saves stay quiet."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import goodput as gp
from goodput.checkpoint import list_checkpoints


def _manager(root: Path, strategy: str = "dcp", every: int = 50) -> gp.CheckpointManager:
    return gp.CheckpointManager(
        gp.CheckpointConfig(root=str(root), strategy=strategy, every=every),
        gp.TrainingState(model=torch.nn.Linear(2, 2)),
    )


def _committed(root: Path) -> list[int]:
    return sorted(r.step for r in list_checkpoints(str(root)) if r.status == "committed")


def test_close_with_the_final_step_saves_it_once(tmp_path: Path) -> None:
    ckpt = _manager(tmp_path, "dcp_async")
    for step in range(1, 74):
        ckpt.maybe_save(step)
    ckpt.close(step=73)
    assert _committed(tmp_path) == [50, 73]
    again = _manager(tmp_path)
    assert again.restore_latest() == 73
    again.close(step=73)  # already committed: nothing new
    assert _committed(tmp_path) == [50, 73]


def test_close_without_the_final_step_says_it_was_not_saved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = _manager(tmp_path)
    for step in range(1, 61):
        ckpt.maybe_save(step)
    with caplog.at_level(logging.WARNING, logger="goodput.checkpoint.manager"):
        ckpt.close()
    assert "closing without saving step 60 (newest checkpoint: step 50): pass close(step=60)" in caplog.text
    assert _committed(tmp_path) == [50]


def test_a_single_process_save_and_restore_shows_no_dcp_warning(tmp_path: Path, recwarn: object) -> None:
    for strategy in ("dcp", "dcp_async"):
        ckpt = _manager(tmp_path / strategy, strategy, every=1)
        ckpt.save(1)
        assert ckpt.restore_latest() == 1
        ckpt.close(step=2)
    assert isinstance(recwarn, pytest.WarningsRecorder)
    assert not [w for w in recwarn.list if "torch.distributed is disabled" in str(w.message)]
