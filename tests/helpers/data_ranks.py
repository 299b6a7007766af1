"""A tiny data-parallel "training" job for the SIGKILL test (spawned processes import it).

Each rank joins a gloo group, restores the data position every rank saved (the newest step all ranks reached),
and runs steps: receive a batch, log its samples, all-reduce (the ranks' lockstep), save the position to a
JSON file. With ``kill_at`` set, rank 1 SIGKILLs itself at that step after receiving its batch and before
saving, as a machine failure would.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from typing import Any

N, BATCH, SEED = 96, 4, 5


def _committed(workdir: str, world: int) -> dict[str, Any] | None:
    saved = []
    for rank in range(world):
        path = os.path.join(workdir, f"position-rank{rank}.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            saved.append(json.load(f))
    return min(saved, key=lambda s: s["step"])  # the newest step every rank saved


def save_json(path: str, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` whole or not at all (a temporary file, fsynced, then renamed)."""
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def join_gloo(rank: int, world: int, port: int) -> None:
    """Join the job's gloo group at 127.0.0.1:``port`` as ``rank`` of ``world``."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )


def train(rank: int, world: int, port: int, workdir: str, attempt: int, kill_at: int | None) -> None:
    import torch
    import torch.distributed as dist

    from goodput import ResumableLoader
    from tests.helpers.data import Squares, ids

    join_gloo(rank, world, port)
    # rank and world size come from torch.distributed; fork workers as torchrun-launched jobs do
    loader = ResumableLoader(
        Squares(N), batch_size=BATCH, seed=SEED, num_workers=1, multiprocessing_context="fork"
    )
    committed = _committed(workdir, world)
    step = 0
    if committed is not None:
        loader.load_state_dict(committed["loader"])
        step = committed["step"]
    log_path = os.path.join(workdir, f"samples-attempt{attempt}-rank{rank}.jsonl")
    with open(log_path, "a") as log:
        for batch in loader:
            log.write(json.dumps({"step": step, "samples": ids(batch)}) + "\n")
            log.flush()
            if rank == 1 and step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(batch.sum(dtype=torch.float64))  # the training step keeps the ranks in lockstep
            step += 1
            save_json(
                os.path.join(workdir, f"position-rank{rank}.json"),
                {"step": step, "loader": loader.state_dict()},
            )
    dist.destroy_process_group()
