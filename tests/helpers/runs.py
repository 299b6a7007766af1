"""A one-process ``goodput.Run`` training a linear model: what a test of a run's reports (its exporters) drives."""

from __future__ import annotations

import os
from typing import Any

import torch

import goodput as gp


def linear_run(
    run_dir: str, exporter: Any, *, total_steps: int, every: int
) -> tuple[gp.Run, torch.nn.Linear, torch.optim.SGD, gp.ResumableLoader]:
    """A restored run of a ``Linear(4, 1)`` on 64 random rows in batches of 4 that saves with torch.save every
    ``every`` steps, scores stragglers every 5 and reports to ``exporter``; and its model, optimizer and loader."""
    config = gp.CheckpointConfig(root=os.path.join(run_dir, "ckpt"), strategy="torch_save", every=every)
    run = gp.Run(
        run_dir,
        checkpoint=config,
        total_steps=total_steps,
        hang_timeout=None,
        progress=False,
        exporters=[exporter],
        stragglers=gp.StragglerConfig(every=5),
    )
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = gp.ResumableLoader(torch.randn(64, 4), batch_size=4, seed=0)
    run.restore(model=model, optimizer=opt, loader=loader)
    return run, model, opt, loader
