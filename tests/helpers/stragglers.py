"""A one-process ``goodput.Run`` with the straggler detector on, for the tests of what reaches its exporters."""

from __future__ import annotations

import os

import torch

import goodput as gp


def straggler_run(
    run_dir: str, exporter: gp.MetricsExporter, *, total_steps: int, every: int
) -> tuple[gp.Run, torch.nn.Linear, torch.optim.SGD, gp.ResumableLoader]:
    """A run in ``run_dir`` reporting to ``exporter``, its straggler window 5 steps, checkpointed by torch.save
    every ``every`` steps, restored with a 4 -> 1 linear model, SGD and 64 random rows in batches of 4: the run,
    model, optimizer and loader, ready for the training loop."""
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
