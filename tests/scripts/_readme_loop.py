"""What the user scripts beside this file share: a fixed regression set and the README's training loop.

Each script imports it as a sibling module (Python puts a script's folder first on ``sys.path``), so a script
still runs by its path alone: ``goodput launch ... -- tests/scripts/fsdp_train.py``. Tests that train in their
own process import it as ``tests.scripts._readme_loop``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import goodput as gp


class Points(torch.utils.data.Dataset):
    """A fixed regression set: ``n`` points with ``features`` features and a noisy linear target, the same on
    every rank and every run of the same ``seed``."""

    def __init__(self, n: int = 256, features: int = 8, seed: int = 1234) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=g)
        self.y = self.x @ torch.randn(features, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def fit(
    run: gp.Run,
    loader: gp.ResumableLoader,
    loss_of: Callable[[Any], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> None:
    """The README's loop over a restored run: one optimizer step a batch, ``step_done`` after it, then close."""
    for batch in run.batches(loader):
        loss = loss_of(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        run.step_done(loss=loss.item())
    run.close()
