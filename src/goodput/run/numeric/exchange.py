"""The numeric guard's agreement: every rank's word for a step, all-gathered on the guard's own gloo group.

The exchange of step N starts at its ``step_done`` and is read at step N+1's, so the step's own work hides the
round trip; every rank reads the same matrix and draws the same verdict from it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Exchange", "all_gather_flat", "new_group", "shared_window", "start_gather"]


def new_group() -> Any:
    """The guard's gloo group, with the warm restarts' collective timeout when there is one (a new group's
    default is torch's 30 minutes): a survivor whose peer died mid-exchange fails as soon as in the job's group."""
    import datetime
    import os

    import torch.distributed as dist

    from goodput._env import WARM_PG_TIMEOUT

    seconds = os.environ.get(WARM_PG_TIMEOUT.name)  # unset outside warm restarts: torch's default
    timeout = datetime.timedelta(seconds=float(seconds)) if seconds else None
    return dist.new_group(backend="gloo", timeout=timeout)


def all_gather_flat(output: Any, tensor: Any, *, group: Any, async_op: bool = False) -> Any:
    """Every rank's ``tensor`` gathered into the flat ``output`` (world size x its elements), by rank: torch's
    ``all_gather_single`` where it has one (2.13 on), else the same collective under its older name,
    ``all_gather_into_tensor``, which 2.13 deprecates with a warning on every call."""
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, tensor, group=group, async_op=async_op)


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


def start_gather(step: int, row: list[int], group: Any) -> Exchange:
    """Start the all-gather of every rank's ``row`` (int64s) for ``step`` on ``group`` (None: this rank alone,
    done at once)."""
    import torch
    import torch.distributed as dist

    if group is None:
        return Exchange(step, None, [row])
    out = torch.empty(dist.get_world_size(group), len(row), dtype=torch.int64)
    tensor = torch.tensor(row, dtype=torch.int64)
    return Exchange(step, all_gather_flat(out.view(-1), tensor, group=group, async_op=True), out)


def shared_window(window: list[tuple[int, float]], group: Any) -> list[tuple[int, float]]:
    """The spike rule's window of ``(step, mean loss)`` that every rank of ``group`` judges from: the longest any
    rank holds (a warm restart's survivors hold the same one, a hot spare or a fresh process none). Every rank
    of the group calls it at the same point; None: this rank alone."""
    import torch
    import torch.distributed as dist

    if group is None:
        return window
    sizes = torch.empty(dist.get_world_size(group), dtype=torch.int64)
    all_gather_flat(sizes, torch.tensor([len(window)], dtype=torch.int64), group=group)
    source = int(torch.argmax(sizes))  # the first rank that holds the longest
    count = int(sizes[source])
    if count == 0:
        return []
    mine = dist.get_rank(group) == source
    rows = torch.tensor(window if mine else [(0.0, 0.0)] * count, dtype=torch.float64)
    dist.broadcast(rows, src=dist.get_global_rank(group, source), group=group)
    return [(int(step), float(loss)) for step, loss in rows.tolist()]
