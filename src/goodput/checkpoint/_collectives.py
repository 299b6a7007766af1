"""The checkpoint manager's two gloo groups and the few collectives its tiers run on them.

One group (``ctl``) carries the training thread's decisions, the other (``io``) the writes and commits that may
run in the background, so checkpoint traffic never interleaves with training collectives or with each other.
The manager makes one :class:`Collectives` and hands it to each tier, so no tier reaches into another's members.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

__all__ = ["Collectives"]

T = TypeVar("T")


class Collectives:
    """Broadcast, gather and barrier on the manager's groups; with no process group, every call is local.

    Args:
        process_group: the training group whose ranks the new groups span (None: the default group).
        over: whether the groups' generation is over (warm restarts): no collective starts on them then, and a
            wait for a save in flight stops (``DurableCheckpointer.settle``).
    """

    def __init__(self, process_group: Any = None, over: Callable[[], bool] | None = None) -> None:
        self.over = over
        self.distributed = dist.is_available() and dist.is_initialized()
        self.ranks: list[int] | None = (
            dist.get_process_group_ranks(process_group)
            if self.distributed and process_group is not None
            else None
        )
        self.ctl: Any = dist.new_group(ranks=self.ranks, backend="gloo") if self.distributed else None
        self.io: Any = dist.new_group(ranks=self.ranks, backend="gloo") if self.distributed else None
        self.rank = dist.get_rank(self.ctl) if self.distributed else 0
        self.world_size = dist.get_world_size(self.ctl) if self.distributed else 1

    def ensure_open(self) -> None:
        """Raise ``DistError`` when the groups' generation is over: a save's background half abandoned by its
        generation must not enqueue a collective on a group the rank has shut down since (that work never runs,
        and the thread would wait for it until the process ends)."""
        if self.distributed and self.over is not None and self.over():
            raise dist.DistError(
                "goodput: the process group's generation is over: no collective starts on it"
            )

    def bcast(self, value: Any, group: Any = None) -> Any:
        """Rank 0's ``value`` on every rank (``group``: default the control group)."""
        if not self.distributed:
            return value
        self.ensure_open()
        pg: Any = group or self.ctl
        box = [value]
        dist.broadcast_object_list(box, src=dist.get_global_rank(pg, 0), group=pg)
        return box[0]

    def rank0_decides(
        self, attempt: Callable[[], T], failed: Callable[[Exception], T], group: Any = None
    ) -> T:
        """Rank 0 runs ``attempt`` and every rank returns its result (``group``: as for :meth:`bcast`).

        An exception on rank 0 becomes ``failed(err)``: every rank waits for rank 0's word, so it always sends one.
        """
        result: Any = None
        if self.rank == 0:
            try:
                result = attempt()
            except Exception as err:
                result = failed(err)
        return self.bcast(result, group)

    def all_gather(self, mine: Any) -> list[Any]:
        """Every rank's value, in rank order, on every rank (control group)."""
        if not self.distributed:
            return [mine]
        self.ensure_open()
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, mine, group=self.ctl)
        return out

    def gather_io(self, mine: Any) -> list[Any]:
        """Every rank's value on rank 0 (an empty list elsewhere), on the background group."""
        if not self.distributed:
            return [mine]
        box: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        assert self.io is not None
        self.ensure_open()
        dist.gather_object(mine, box, dst=dist.get_global_rank(self.io, 0), group=self.io)
        return list(box or [])

    def barrier(self) -> None:
        if self.distributed:
            self.ensure_open()
            dist.barrier(group=self.ctl)

    def take_groups(self) -> list[Any]:
        """Hand over both groups (to be released) and forget them."""
        groups = [g for g in (self.ctl, self.io) if g is not None]
        self.ctl = self.io = None
        return groups
