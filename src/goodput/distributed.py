"""Process-group set-up that survives torchrun restarts.

By default torchrun's workers connect to the agent's TCP store, which outlives them. gloo publishes each
rank's address there under fixed keys, so a restarted worker can read the dead attempt's address and fail
("Gloo connectFullMesh failed") or hang. When the agent's store is shared (``TORCHELASTIC_USE_AGENT_STORE``),
``init_distributed`` prefixes it with the attempt number (``TORCHELASTIC_RESTART_COUNT``), so each attempt
rendezvouses in a namespace of its own. That count is per agent, so on several nodes it can differ between
nodes: ``goodput launch`` therefore turns store sharing off (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), and each
rendezvous round's rank 0 then hosts a fresh store on a fresh port, which needs no prefix.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

__all__ = ["DistInfo", "dist_info", "init_distributed"]


@dataclasses.dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the job."""

    rank: int
    world_size: int
    local_rank: int
    attempt: int


def dist_info() -> DistInfo:
    """Rank, world size, local rank and attempt number, from torch.distributed or torchrun's environment."""
    import torch.distributed as dist

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if dist.is_available() and dist.is_initialized():
        return DistInfo(
            dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), attempt
        )
    return DistInfo(
        int(os.environ.get("RANK", "0")),
        int(os.environ.get("WORLD_SIZE", "1")),
        int(os.environ.get("LOCAL_RANK", "0")),
        attempt,
    )


def init_distributed(backend: str | None = None, *, timeout: float = 300.0) -> DistInfo:
    """Join the job's process group, in a store namespace of this attempt's own.

    A no-op for a single process (WORLD_SIZE unset or 1) or when a group already exists.

    Args:
        backend: "gloo", "nccl" or None for nccl when CUDA is available, else gloo.
        timeout: seconds for rendezvous and collectives.
    """
    import torch
    import torch.distributed as dist

    info = dist_info()
    if info.world_size <= 1 or dist.is_initialized():
        return info
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    wait = datetime.timedelta(seconds=timeout)
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        info.world_size,
        is_master=info.rank == 0 and not agent_store,
        timeout=wait,
    )
    store = dist.PrefixStore(f"goodput/attempt-{info.attempt}", base) if agent_store else base
    dist.init_process_group(backend, store=store, rank=info.rank, world_size=info.world_size, timeout=wait)
    return info
