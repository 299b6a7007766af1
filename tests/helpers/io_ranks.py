"""Module-level rank functions for tests/checkpoint/test_checkpoint_io.py (spawned ranks must be able to import them)."""

from __future__ import annotations

import time
from typing import Any

import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState


def schedule_saves(rank: int, world: int, root: str, every: str | int, steps: int) -> dict[str, Any]:
    """Run ``steps`` steps whose length differs per rank and varies; record at which steps this rank saved."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    config = CheckpointConfig(
        root=f"{root}/{every}", strategy="dcp", every=every, keep_last=1, max_interval="0.15s"
    )
    manager = CheckpointManager(config, TrainingState(model=model))
    saved = []
    for step in range(1, steps + 1):
        time.sleep(0.002 + 0.003 * ((step * (rank + 1)) % 3))  # the step's work: ranks differ, steps vary
        with torch.no_grad():
            model.weight.add_(0.01)
        if manager.should_save(step):
            manager.save(step)
            saved.append(step)
    decisions = manager.decisions
    manager.close()
    return {"saved": saved, "decisions": decisions}
