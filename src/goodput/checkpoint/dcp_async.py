"""The ``dcp_async`` strategy: ``torch.distributed.checkpoint.async_save``; training pays only for staging.

``save`` copies the state into staging buffers (allocated at the first save and reused by every later one:
one ``DefaultStager`` lives as long as the strategy) and returns; the write runs in the background on the
checkpoint's own gloo group. The manager keeps at most one save in flight.

On CPU-only torch the stager must not use non-blocking copies or pinned memory (both need an accelerator).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from goodput.checkpoint.dcp import files_of_rank, load_dcp, make_writer, single_process
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.strategy import Completion, SaveContext

__all__ = ["DcpAsyncStrategy"]


class DcpAsyncStrategy:
    """Asynchronous DCP with reused staging buffers.

    Args:
        checkpointer: ``"thread"`` (write in a thread of the training process) or ``"process"`` (a helper
            process that DCP starts once; the training script then needs an ``if __name__ == "__main__"`` guard).
    """

    name = "dcp_async"
    is_async = True

    def __init__(self, checkpointer: str = "thread") -> None:
        if checkpointer not in ("thread", "process"):
            raise ValueError(f"checkpointer must be 'thread' or 'process', not {checkpointer!r}")
        self._type = (
            AsyncCheckpointerType.PROCESS if checkpointer == "process" else AsyncCheckpointerType.THREAD
        )
        cuda = torch.cuda.is_available()
        self._stager: Any = DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda,
                use_shared_memory=checkpointer == "process",
                use_async_staging=False,
                use_non_blocking_copy=cuda,
            )
        )

    def save(self, state: TrainingState, folder: str, ctx: SaveContext) -> Completion:
        future: Any = dcp.async_save(
            state.state_dict(),
            storage_writer=make_writer(folder, ctx),
            process_group=ctx.group,
            async_checkpointer_type=self._type,
            async_stager=self._stager,
            no_dist=single_process(),
        )
        rank = ctx.rank

        def complete() -> list[str]:
            return files_of_rank(future.result(), rank)

        return complete

    def load(self, state: TrainingState, folder: str, ctx: SaveContext) -> None:
        load_dcp(state, folder, ctx)

    def close(self) -> None:
        self._stager.close()
