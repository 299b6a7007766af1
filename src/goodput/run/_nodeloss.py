"""The ``nodeloss`` drill's second half: the lost node comes back as a fresh machine, its memory tier empty.

The fault plan (``goodput.faults``) kills every rank of the node and leaves a ``lost-node-<n>`` request in the
run's fault folder; at the next restore, before any checkpoint is read, this hook empties that node's memory
tier (its local rank 0 does, between two barriers so that no rank of the job reads it meanwhile).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from goodput.faults import lost_node_file
from goodput.run.hooks import RunHook

if TYPE_CHECKING:
    from goodput.checkpoint.state import TrainingState
    from goodput.run.run import Run

__all__ = ["NodeLossDrill"]


class NodeLossDrill(RunHook):
    """Empties a lost node's memory tier before the restore (only in runs whose plan has a ``nodeloss``)."""

    def before_restore(self, run: Run, state: TrainingState) -> int | None:
        import torch.distributed as dist

        request = lost_node_file(os.path.join(run.run_dir, "faults"), run.faults.node)
        lost = os.path.exists(request)
        if dist.is_initialized():
            dist.barrier()
        memory: Any = run.manager.tier("memory")
        if lost and memory is not None and run.info.local_rank == 0:
            memory.store.wipe_node()
            os.remove(request)
        if dist.is_initialized():
            dist.barrier()
        return None
