"""The numeric guard's agreement: every rank's word for a step, all-gathered on the guard's own gloo group.

The exchange of step N starts at its ``step_done`` and is read at step N+1's, so the step's own work hides the
round trip; every rank reads the same matrix and draws the same verdict from it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Exchange", "gather_rows", "new_group", "start_gather"]


def new_group() -> Any:
    """The guard's gloo group, with the warm restarts' collective timeout when there is one (a new group's
    default is torch's 30 minutes): a survivor whose peer died mid-exchange fails as soon as in the job's group."""
    import datetime
    import os

    import torch.distributed as dist

    from goodput.warm.worker import PG_TIMEOUT_ENV

    seconds = os.environ.get(PG_TIMEOUT_ENV)
    timeout = datetime.timedelta(seconds=float(seconds)) if seconds else None
    return dist.new_group(backend="gloo", timeout=timeout)


class Exchange:
    """One step's all-gather of every rank's word, started at its ``step_done`` and read at the next."""

    def __init__(self, step: int, work: Any, out: Any) -> None:
        self.step, self._work, self._out = step, work, out

    def rows(self) -> list[list[int]]:
        """Every rank's row, by rank (waits for the exchange when it is still running)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        if not isinstance(self._out, list):
            self._out = self._out.tolist()
        return list(self._out)


def start_gather(row: list[int], group: Any) -> tuple[Any, Any]:
    """Start the all-gather of every rank's ``row`` (int64s) on ``group``: (its work, the (world, len) tensor
    it fills)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    out = torch.empty(world, len(row), dtype=torch.int64)
    work = dist.all_gather_single(
        out.view(-1), torch.tensor(row, dtype=torch.int64), group=group, async_op=True
    )
    return work, out


def gather_rows(row: list[int], group: Any) -> list[list[int]]:
    """Every rank's ``row`` (int64s), by rank: one all-gather on ``group``, waited for."""
    work, out = start_gather(row, group)
    work.wait()
    rows: list[list[int]] = out.tolist()
    return rows
