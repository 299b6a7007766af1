"""The ``optimizer_step`` fault phase: it fires after the optimizer of the step it names has stepped, before the
step is done (the moment a rank's gradients are in its peers' step but its own ``step_done`` never comes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import goodput as gp
from goodput.faults import InjectedFault


class _Job:
    """A linear model trained under a ``Run`` with the fault plan ``faults``."""

    def __init__(self, run_dir: Path, faults: str) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.run = gp.Run(str(run_dir), total_steps=6, progress=False, hang_timeout=None, faults=faults)
        self.run.restore(model=self.model, optimizer=self.optimizer)

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.model(torch.ones(2, 4)).sum().backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.run.step_done()


def _weight_after(run_dir: Path, steps: int) -> torch.Tensor:
    job = _Job(run_dir, "")
    try:
        job.train(steps)
    finally:
        job.run.close()
    return job.model.weight.detach().clone()


def test_the_fault_fires_after_the_named_step_s_optimizer_step_and_before_step_done(tmp_path: Path) -> None:
    two, three = _weight_after(tmp_path / "two", 2), _weight_after(tmp_path / "three", 3)
    assert not torch.equal(two, three)
    job = _Job(tmp_path / "faulty", "raise@phase=optimizer_step,step=3")
    try:
        with pytest.raises(InjectedFault):
            job.train(6)
        assert job.run.step == 2  # step 3's step_done never ran
        assert torch.equal(job.model.weight, three)  # but its optimizer step was applied
    finally:
        job.run.close()


def test_a_plan_without_the_phase_adds_no_hook_to_the_optimizer(tmp_path: Path) -> None:
    job = _Job(tmp_path / "other", "raise@step=5")
    try:
        assert not job.optimizer._optimizer_step_post_hooks
    finally:
        job.run.close()
    job = _Job(tmp_path / "this", "raise@phase=optimizer_step,step=5")
    try:
        assert len(job.optimizer._optimizer_step_post_hooks) == 1
    finally:
        job.run.close()
