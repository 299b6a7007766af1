"""Module-level code for tests/checkpoint/test_teardown.py: a rank function for ``run_ranks``, and, run as a script, one rank
of a real job that saves, finds its only checkpoint refused, and ends with ``EXIT_FATAL`` through the ordinary
interpreter exit (no ``os._exit``)."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

import torch.distributed as dist

from goodput.checkpoint import CheckpointConfig, CheckpointManager
from tests.helpers.ckpt_ranks import Job


def _threads() -> int:
    """This process's threads, C++ ones (gloo's workers and I/O loops) included."""
    return len(os.listdir("/proc/self/task"))


def _collections_in(call: Any) -> int:
    """How many garbage collections ``call()`` ran itself (automatic ones are off meanwhile), as the collector's
    own callbacks report them."""
    started: list[str] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(phase)

    automatic = gc.isenabled()
    gc.disable()
    gc.callbacks.append(seen)
    try:
        call()
    finally:
        gc.callbacks.remove(seen)
        if automatic:
            gc.enable()
    return len(started)


def _corrupt_shards(root: str, step: int) -> None:
    """Flip the last byte of every shard file of ``step`` (rank 0, after every rank has written)."""
    folder = os.path.join(root, f"step-{step}")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".distcp"):
            with open(os.path.join(folder, name), "r+b") as f:
                f.seek(-1, os.SEEK_END)
                byte = f.read(1)
                f.seek(-1, os.SEEK_END)
                f.write(bytes([byte[0] ^ 0xFF]))


def save_then_refused_restore(rank: int, world: int, root: str) -> dict[str, Any]:
    """FSDP job: save step 1, corrupt it, restore (refused: None); the thread counts before and after each
    manager's life."""
    job = Job(rank, width=256, wrap="fsdp")
    job.step()
    before = _threads()
    saver = CheckpointManager(CheckpointConfig(root=root, strategy="dcp"), job.state)
    during = _threads()
    saver.save(1)
    saver.wait()
    collections = _collections_in(saver.close)
    after_save = _threads()
    if rank == 0:
        _corrupt_shards(root, 1)
    dist.barrier()
    # allowed to start fresh, so the refused checkpoint ends in None rather than NoValidCheckpoint
    config = CheckpointConfig(root=root, strategy="dcp", allow_fresh_start=True)
    restorer = CheckpointManager(config, job.state)
    restored = restorer.restore_latest()
    restorer.close()
    return {
        "restored": restored,
        "before": before,
        "during": during,
        "after_save": after_save,
        "collections_in_close": collections,
        "after_restore": _threads(),
    }


def main(root: str) -> int:
    """One rank of the real job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment)."""
    from goodput.job.codes import EXIT_FATAL

    dist.init_process_group("gloo")
    result = save_then_refused_restore(dist.get_rank(), dist.get_world_size(), root)
    dist.destroy_process_group()
    print(f"restored {result['restored']}", flush=True)
    return EXIT_FATAL if result["restored"] is None else 0  # no usable checkpoint: a restart cannot fix it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
