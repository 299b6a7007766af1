"""Module-level rank functions for tests (spawned processes must be able to import them)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def allreduce_rank(rank: int, world: int) -> float:
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return float(t.item())


def fail_on_rank_one(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("rank one was told to fail")
    return rank
