"""A real single-process ``goodput.Run`` of a linear model on random points, feeding one exporter, with the
straggler detector's window small enough that a short run scores several."""

from __future__ import annotations

import os
from typing import Any

import torch

import goodput as gp


def run_with_exporter(
    run_dir: str, exporter: Any, *, total_steps: int, every: int
) -> tuple[gp.Run, torch.nn.Module, torch.optim.Optimizer, gp.ResumableLoader]:
    """A restored ``Run`` (nothing to restore yet), its model, optimizer and loader; the caller drives the loop."""
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
