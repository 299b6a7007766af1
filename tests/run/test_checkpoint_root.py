"""A ``CheckpointConfig`` written without a root (``checkpoint=gp.CheckpointConfig(every=5)``, as the README's
comment invites) saves under the run folder with ``goodput.Run``; a ``CheckpointManager`` used on its own asks
for one in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import goodput as gp
from goodput.errors import ConfigError
from tests.helpers import data as _data


def _train(run_dir: Path, steps: int, config: gp.CheckpointConfig) -> tuple[gp.Run, int | None]:
    loader = gp.ResumableLoader(_data.Squares(40), batch_size=4, seed=1)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    run = gp.Run(str(run_dir), checkpoint=config, total_steps=steps, progress=False, hang_timeout=None)
    restored = run.restore(model=model, optimizer=opt, loader=loader)
    for batch in run.batches(loader):
        model(batch.float()).square().mean().backward()
        opt.step()
        opt.zero_grad()
        run.step_done()
    run.close()
    return run, restored


def test_a_config_without_a_root_saves_in_the_run_folder_and_resumes_from_it(tmp_path: Path) -> None:
    config = gp.CheckpointConfig(strategy="torch_save", every=2)
    _train(tmp_path / "run", 4, config)
    assert sorted(
        p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.startswith("step-")
    ) == [
        "step-2",
        "step-4",
    ]
    resumed, restored = _train(tmp_path / "run", 6, config)
    assert resumed.config.root == str(tmp_path / "run" / "checkpoints") and restored == 4


def test_a_manager_on_its_own_without_a_root_says_so_in_one_line() -> None:
    state = gp.TrainingState(model=torch.nn.Linear(2, 1))
    with pytest.raises(ConfigError, match=r"CheckpointConfig has no root: give root=") as raised:
        gp.CheckpointManager(gp.CheckpointConfig(every=2), state)
    assert "\n" not in str(raised.value)
