"""Module-level rank functions for tests (the ranks run in processes of their own, which must be able to import them)."""

from __future__ import annotations

import os

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


def log_then_fail_on_rank_one(rank: int, world: int, path: str) -> int:
    with open(path, "a") as f:
        f.write(f"rank {rank} ran\n")
    dist.barrier()  # both ranks wrote before rank one fails
    return fail_on_rank_one(rank, world)


def process_rank(rank: int, world: int, name: str) -> tuple[int, int, str | None]:
    """This rank's process id, its parent's, and the environment variable ``name`` as the rank sees it."""
    return os.getpid(), os.getppid(), os.environ.get(name)
