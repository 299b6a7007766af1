"""``GOODPUT_STOP_AFTER``: Run saves the given step, closes and ends the process with exit 0 after it (the parts
of verify-resume's reference runs); the next launch resumes from that step."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import goodput as gp
from goodput._env import STOP_AFTER


def _train(run_dir: str) -> list[int]:
    run = gp.Run(run_dir, total_steps=10, checkpoint=gp.CheckpointConfig(root=os.path.join(run_dir, "ck"), every=100),
                 hang_timeout=None, progress=False)  # fmt: skip
    model = torch.nn.Linear(2, 1)
    loader = gp.ResumableLoader(torch.utils.data.TensorDataset(torch.randn(40, 2)), batch_size=2, seed=0)
    run.restore(model=model, loader=loader)
    steps = []
    with run:
        for _ in run.batches(loader):
            steps.append(run.step + 1)
            run.step_done()
            if run.step == 10:
                break
    return steps


def test_a_run_stops_after_the_step_saved_and_the_next_launch_goes_on_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STOP_AFTER.name, "4")
    with pytest.raises(SystemExit) as stopped:
        _train(str(tmp_path))
    assert stopped.value.code == 0
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-4"]
    monkeypatch.delenv(STOP_AFTER.name)
    assert _train(str(tmp_path)) == [5, 6, 7, 8, 9, 10]
