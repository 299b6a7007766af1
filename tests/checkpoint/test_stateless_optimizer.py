"""An optimizer that keeps no tensors (SGD without momentum) resumes from every strategy.

Loaded as a full state dict, torch's ``set_state_dict`` looks for a device among the optimizer's tensors and
asserts when there is none, so a whole model's ``torch_save`` checkpoint is loaded as its local state dict."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState


def _trained(
    seed: int,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        model(torch.randn(2, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, opt, sched


@pytest.mark.parametrize("strategy", ["torch_save", "dcp"])
def test_sgd_without_momentum_resumes_bitwise(tmp_path: Path, strategy: str) -> None:
    model, opt, sched = _trained(seed=0)
    assert opt.state_dict()["state"] == {}  # no tensor kept per parameter
    config = CheckpointConfig(root=str(tmp_path), strategy=strategy, every=1)
    manager = CheckpointManager(config, TrainingState(model=model, optimizer=opt, scheduler=sched))
    manager.save(3)
    manager.close()

    fresh_model, fresh_opt, fresh_sched = _trained(seed=1)  # other weights, and the same schedule's lr
    fresh = CheckpointManager(
        config, TrainingState(model=fresh_model, optimizer=fresh_opt, scheduler=fresh_sched)
    )
    assert fresh.restore_latest() == 3
    fresh.close()
    for name, value in model.state_dict().items():
        assert torch.equal(value, fresh_model.state_dict()[name]), name
    assert fresh_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.1 * 0.5**3
