"""The ``dcp_async`` strategy: training pays only for copying the state into reused staging buffers.

``save`` copies the state into goodput's ``Stager`` (buffers allocated at the first save and reused by every
later one; pinned on CUDA) with plain tensor copies, and returns; the write is ``dcp.save`` of the staged
state dict, run by the manager's background thread on the checkpoint's own gloo group. DCP's save plans are
cached between saves (``DefaultSavePlanner(enable_plan_caching=True)``, one cache per strategy), so a save whose
state has the same structure as the previous one skips planning's work and sends empty plans. The manager keeps
at most one save in flight, so the buffers are never overwritten while a write still reads them.

``checkpointer="process"`` keeps DCP's own ``async_save`` with its process-based checkpointer and a
shared-memory ``DefaultStager`` (for hosts with spare cores where the writer thread's GIL time matters).
"""

from __future__ import annotations

import uuid
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from goodput.checkpoint.durable.dcp import load_dcp, make_writer, single_process, written_files
from goodput.checkpoint.durable.staging import Stager
from goodput.checkpoint.durable.strategy import Completion, SaveContext
from goodput.checkpoint.state import TrainingState

__all__ = ["DcpAsyncStrategy"]

_PLAN_CACHES = ("_cached_save_plan", "_cached_all_plans", "_cached_global_plan", "_cached_metadata",
                "_cached_final_save_plan")  # fmt: skip


class _CachingPlanner(DefaultSavePlanner):
    """DCP's default planner with plan caching under a key of its own (DCP keys the cache by class name, which
    two managers in one process would share)."""

    def __init__(self, key: str) -> None:
        super().__init__(enable_plan_caching=True)
        self._cached_plans_key = key


def _forget_plans(key: str) -> None:
    for name in _PLAN_CACHES:
        getattr(SavePlanner, name, {}).pop(key, None)


class DcpAsyncStrategy:
    """Asynchronous DCP with reused staging buffers.

    Args:
        checkpointer: ``"thread"`` (goodput's stager; the manager's background thread writes) or ``"process"``
            (DCP's ``async_save`` with a helper process; the training script then needs an
            ``if __name__ == "__main__"`` guard).
    """

    name = "dcp_async"
    is_async = True
    verifies_on_read = True

    def __init__(self, checkpointer: str = "thread") -> None:
        if checkpointer not in ("thread", "process"):
            raise ValueError(f"checkpointer must be 'thread' or 'process', not {checkpointer!r}")
        self._process = checkpointer == "process"
        # the thread checkpointer only stages in save(); the manager creates the folder in the background
        self.writes_later = not self._process
        self._key = f"goodput-{uuid.uuid4().hex}"
        self.stager = Stager()
        self._dcp_stager: Any = None
        self.last_load_seconds: dict[str, float] = {}

    def save(self, state: TrainingState, folder: str, ctx: SaveContext) -> Completion:
        if self._process:
            return self._save_process(state, folder, ctx)
        return self.save_staged(self.stager.stage(state.state_dict()), folder, ctx)

    def save_staged(self, staged: dict[str, Any], folder: str, ctx: SaveContext) -> Completion:
        """Write a state dict already staged (by this strategy, or by the memory tier for the same step): its
        tensors must stay unchanged until the completion has run."""
        rank, no_dist = ctx.rank, single_process()

        def complete() -> dict[str, str | None]:
            writer = make_writer(folder, ctx)
            metadata = dcp.save(
                staged,
                storage_writer=writer,
                planner=_CachingPlanner(self._key),
                process_group=ctx.group,
                no_dist=no_dist,
            )
            return written_files(writer, metadata, rank)

        return complete

    def _save_process(self, state: TrainingState, folder: str, ctx: SaveContext) -> Completion:
        if self._dcp_stager is None:
            cuda = torch.cuda.is_available()
            self._dcp_stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda,
                    use_shared_memory=True,
                    use_async_staging=False,
                    use_non_blocking_copy=cuda,
                )
            )
        writer = make_writer(folder, ctx, in_process=False)  # pickled to the helper process
        future: Any = dcp.async_save(
            state.state_dict(),
            storage_writer=writer,
            process_group=ctx.group,
            async_checkpointer_type=AsyncCheckpointerType.PROCESS,
            async_stager=self._dcp_stager,
            no_dist=single_process(),
        )
        rank = ctx.rank

        def complete() -> dict[str, str | None]:
            # the helper process wrote the files: its writer's checksums are not visible here (read back)
            names = written_files(writer, future.result(), rank)
            return dict.fromkeys(names)

        return complete

    def load(self, state: TrainingState, folder: str, ctx: SaveContext) -> None:
        self.last_load_seconds = load_dcp(state, folder, ctx)

    def close(self) -> None:
        self.stager.close()
        _forget_plans(self._key)
        if self._dcp_stager is not None:
            self._dcp_stager.close()
