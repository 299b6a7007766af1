"""The attempt number every rank of a rendezvous round records: one numbering for the whole job.

A ledger left to itself numbers its attempt one more than the highest its own rank wrote, and torchrun's
``TORCHELASTIC_RESTART_COUNT`` is counted per agent: both drift apart between ranks when the world changes.
After a 2 -> 1 -> 2 change (an elastic ``--nnodes 1:2`` job losing a node and gaining one, or relaunches with
another ``--nproc``), rank 0 had three attempts and rank 1 two, so the same round was attempt 2 on one rank
and attempt 1 on the other, and attempt 1 named a one-rank round on rank 0 and a two-rank one on rank 1.
Here every rank proposes one more than the highest attempt of any rank in the ledger folder it sees (a
node-local run folder shows only its node's ranks), and the group takes the highest proposal: one
``all_reduce`` when the process starts, before any rank opens its ledger file. Under warm restarts the same
agreement opens each generation's attempt, in the survivors and in the spares it takes in: a rank number that a
shrink left out has fewer attempts behind it than the survivors, so its newcomer, numbering its own, would
record the grown generation under the attempt of the shrunk one.
"""

from __future__ import annotations

import os
from typing import Any

from goodput.ledger import ledger_files

__all__ = ["agreed_attempt"]


def agreed_attempt(run_dir: str | os.PathLike[str], group: Any = None) -> int:
    """This round's attempt number, the same on every rank of the process group (which must be formed);
    ``group``: a gloo group of every rank to agree over instead of the default group."""
    import torch
    import torch.distributed as dist

    proposal = max((f.attempt for f in ledger_files(run_dir)), default=-1) + 1
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return proposal
    on_gpu = group is None and dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    value = torch.tensor([proposal], dtype=torch.int64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return int(value.item())
