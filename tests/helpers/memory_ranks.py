"""Module-level rank functions for memory-tier tests (spawned ranks must be able to import them)."""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch.distributed as dist

from goodput.checkpoint import CheckpointConfig, CheckpointManager, MemoryTier
from tests.helpers.ckpt_ranks import Job, same


def peer_fallback(rank: int, world: int, root: str, shm: str, damage: str) -> dict[str, Any]:
    """Each rank plays a node of its own; rank 1's own copy of the newest step is damaged (or its whole node
    folder is gone) before the restore, which must then take rank 1's part from node 0's replica."""
    os.environ.update(GROUP_RANK=str(rank), LOCAL_RANK="0")
    config = CheckpointConfig(root=root, every=100, memory=MemoryTier(every=1, folder=shm))
    job = Job(rank)
    manager = CheckpointManager(config, job.state)
    manager.restore_latest()
    for step in range(1, 4):
        job.step()
        manager.maybe_save(step)
    memory: Any = manager.tier("memory")
    memory.wait()
    expected = job.snapshot()
    node_dir = memory.store.node_dir
    manager.close(finished=False)
    dist.barrier()
    if rank == 1:
        if damage == "node_lost":
            shutil.rmtree(node_dir)
        else:
            path = os.path.join(node_dir, "step-3", "rank-1.part")
            with open(path, "r+b") as f:
                f.seek(os.path.getsize(path) // 2)
                byte = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([byte[0] ^ 0xFF]))
    dist.barrier()
    fresh = Job(rank, seed=7)
    events: list[tuple[str, dict[str, Any]]] = []
    again = CheckpointManager(config, fresh.state, on_event=lambda name, **f: events.append((name, f)))
    step = again.restore_latest()
    restored = [f for name, f in events if name == "checkpoint_restored"]
    again.close()
    return {"step": step, "restored": restored, "diffs": same(expected, fresh.snapshot())}
