"""Module-level rank functions for tests/checkpoint/test_restore_reads.py (spawned ranks must be able to import them)."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from goodput.checkpoint import CheckpointConfig, CheckpointManager
from goodput.checkpoint.durable.dcp import METADATA_NAME, safe_unpickle_metadata
from goodput.errors import NoValidCheckpoint
from tests.helpers.ckpt_ranks import Job, same


def restore_through(rank: int, world: int, url: str, direct: dict[str, Any], proxied: dict[str, Any]) -> Any:
    """Save step 2 straight to the server, train on, then restore through ``proxied`` (the fault proxy)."""
    job = Job(rank, width=256, wrap="fsdp")
    for _ in range(2):
        job.step()
    saver = CheckpointManager(CheckpointConfig(root=url, strategy="dcp", storage_options=direct), job.state)
    saver.save(2)
    saver.wait()
    saver.close()
    before = job.snapshot()
    for _ in range(2):
        job.step()
    dist.barrier()
    restorer = CheckpointManager(
        CheckpointConfig(root=url, strategy="dcp", storage_options=proxied), job.state
    )
    restored = restorer.restore_latest()
    restorer.close()
    return {"restored": restored, "diffs": same(before, job.snapshot())}


def _step_items(folder: str) -> dict[str, tuple[str, int, int]]:
    """Where each optimizer step count (a replicated tensor: DCP writes it into one rank's file) lies."""
    with open(os.path.join(folder, METADATA_NAME), "rb") as f:
        metadata = safe_unpickle_metadata(f.read())
    return {
        index.fqn: (info.relative_path, info.offset, info.length)
        for index, info in (metadata.storage_data or {}).items()
        if index.fqn.startswith("optim.state.") and index.fqn.endswith(".step")
    }


def corrupt_file_keeps_partial_reads_out(rank: int, world: int, root: str) -> dict[str, Any]:
    """Save once and restore it (local files, read in part from mapped files); then flip a byte of a shard in
    the file holding the first step count (not in a step count), set every step count to 99 and restore again:
    nothing of that file may reach the live state on any rank."""
    job = Job(rank, width=256, wrap="fsdp")
    job.step()
    saver = CheckpointManager(CheckpointConfig(root=root, strategy="dcp"), job.state)
    saver.save(1)
    saver.wait()
    saver.close()
    before = job.snapshot()
    job.step()
    restorer = CheckpointManager(CheckpointConfig(root=root, strategy="dcp"), job.state)
    healthy = restorer.restore_latest()
    restorer.close()
    diffs = same(before, job.snapshot())
    folder = os.path.join(root, "step-1")
    steps = _step_items(folder)
    corrupt = min(path for path, _, _ in steps.values())
    if rank == 0:
        with open(os.path.join(folder, ".metadata"), "rb") as f:
            metadata = safe_unpickle_metadata(f.read())
        shard = max(
            (info for info in (metadata.storage_data or {}).values() if info.relative_path == corrupt),
            key=lambda info: info.length,
        )
        with open(os.path.join(folder, corrupt), "r+b") as f:
            f.seek(shard.offset + shard.length - 1)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    dist.barrier()
    live = {f"optim.state.{name}.step": job.opt.state[p]["step"] for name, p in job.model.named_parameters()}
    for tensor in live.values():
        tensor.fill_(99)
    restorer = CheckpointManager(CheckpointConfig(root=root, strategy="dcp"), job.state)
    try:
        restored: int | str | None = restorer.restore_latest()
    except NoValidCheckpoint:  # the only checkpoint failed: every rank stops alike
        restored = "refused"
    restorer.close()
    in_corrupt = [fqn for fqn, (path, _, _) in steps.items() if path == corrupt]
    return {
        "healthy": healthy,
        "diffs": diffs,
        "restored": restored,
        "corrupt": corrupt,
        "steps_from_corrupt_file": {fqn: float(live[fqn]) for fqn in in_corrupt},
    }


def one_rank_fails_to_plan(rank: int, world: int, root: str) -> dict[str, Any]:
    """Save steps 1 and 2; then restore while rank 1 alone fails before its read step for step 2 (as a rank whose
    planning raised): no rank may wait for it, and both must fall back to step 1 together."""
    import goodput.checkpoint.durable.dcp as dcp_module

    job = Job(rank, width=256, wrap="fsdp")
    saver = CheckpointManager(CheckpointConfig(root=root, strategy="dcp"), job.state)
    job.step()
    saver.save(1)
    saver.wait()
    at_one = job.snapshot()
    job.step()
    saver.save(2)
    saver.wait()
    saver.close()
    job.step()
    if rank == 1:
        planned = dcp_module._planned_target

        def failing(state: Any, reader: Any) -> Any:
            if str(reader.path).rstrip("/").endswith("step-2"):
                raise RuntimeError("planning failed on rank 1")
            return planned(state, reader)

        dcp_module._planned_target = failing  # type: ignore[assignment]
    restorer = CheckpointManager(CheckpointConfig(root=root, strategy="dcp"), job.state)
    restored = restorer.restore_latest()
    restorer.close()
    return {"restored": restored, "diffs": same(at_one, job.snapshot())}
