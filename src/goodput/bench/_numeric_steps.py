"""``goodput bench numeric``: the agreement and the DDP gradient check timed inside real DDP steps, the guard's
way (after) against the way it had before (before), in alternating blocks of steps of the same run.

* Agreement, before: each step's word all-gathered on the guard's own gloo group, started at the step's end
  and read at the next (the main thread's issue and wait). After: the word rides the next step's first
  gradient bucket (``run/numeric/carry.py``): boarding and reading the word, plus the rider's own calls inside
  the first bucket's hook (its payload, the bucket's storage grown for it, its departure), each timed where it
  runs. Left untimed: the copy of the payload's few elements into the bucket and those elements' share of the
  all-reduce. The hook's whole time is not compared between the two ways: the before-way's all-gather runs
  beside it, and the two medians differed by more than the rider's calls take for identical code.
* DDP gradient check, before: a callback per bucket on the collective's thread summing the reduced bucket,
  and the stack of the step's sums read once. After: ``BucketCheck.take`` before the optimizer step (the
  reduced buckets summed on the main thread, one read).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["in_step_costs"]

_BLOCK = 6  # steps per block of one way; the first of a block is not counted (the other way's word drains)


class _Timers:
    """The before-way's callback sums (a tap of DDP's shared hook), and the seconds spent in the rider's calls
    (wrapped where the hook calls them) since the last :meth:`lap`."""

    def __init__(self) -> None:
        self.before = True
        self.sums: list[Any] = []
        self.sum_seconds = 0.0
        self.rider_seconds = 0.0

    def wrap(self, owner: Any, name: str) -> None:
        """Time every call of ``owner.name`` from now on (an attribute of the instance shadows the method)."""
        call = getattr(owner, name)

        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return call(*args)
            finally:
                self.rider_seconds += time.perf_counter() - start

        setattr(owner, name, timed)

    def lap(self) -> float:
        seconds, self.rider_seconds = self.rider_seconds, 0.0
        return seconds

    def inner(self, bucket: Any, reduce: Any) -> Any:
        if not self.before:
            return reduce()

        def summed(future: Any) -> Any:
            start = time.perf_counter()
            reduced = future.value()
            self.sums.append(reduced.sum())
            self.sum_seconds += time.perf_counter() - start
            return reduced

        return reduce().then(summed)


def in_step_costs(
    model: Any, backward: Callable[[], None], optimize: Callable[[], None], group: Any, steps: int
) -> dict[str, float]:
    """Seconds per step of each way, medians over the counted steps: ``agreement, before|after`` and
    ``gradient check, DDP, before|after``. ``backward`` runs a forward and backward through ``model`` (DDP),
    ``optimize`` the optimizer step; ``group``: a gloo group of every rank."""
    import torch
    import torch.distributed as dist

    from goodput.run._comm_hook import _shared, add_tap
    from goodput.run.numeric.exchange import start_gather
    from goodput.run.numeric.grads import BucketCheck
    from goodput.run.numeric.rules import encode_row

    timers = _Timers()
    check = BucketCheck.install(model, group)
    shared = _shared(model)
    assert check is not None and check.carrier is not None and shared is not None, "the model carries no word"
    for owner, name in ((check.carrier, "payload"), (check.carrier, "departed"), (shared, "_grown")):
        timers.wrap(owner, name)
    add_tap(model, "bench-inner", timers.inner)
    row = encode_row(1, 2.0, dist.get_rank(), 0.0)
    seen: dict[str, list[float]] = {}
    pending: Any = None
    for n in range(steps):
        before = timers.before = (n // _BLOCK) % 2 == 0
        if n % _BLOCK == 0 and pending is not None:
            pending.rows()  # the other way's last word (a word that never rode is all-gathered)
            pending = None
        timers.sum_seconds = 0.0
        timers.lap()
        backward()
        rider_seconds = timers.lap()  # the payload went with the first bucket of this backward
        start = time.perf_counter()
        total: float | None
        if before:
            total = float(torch.stack(timers.sums).sum().item())
            timers.sums.clear()
        else:
            total = check.take()
        grad_seconds = time.perf_counter() - start + timers.sum_seconds
        if before:
            check.take()  # the numeric tap kept this step's buckets too: not the before-way's work
        assert total is not None
        optimize()
        start = time.perf_counter()
        if pending is not None:
            rows = pending.rows()
            assert rows == [encode_row(1, 2.0, r, 0.0) for r in range(len(rows))], rows
        pending = start_gather(n, row, group) if before else check.carrier.board(n, row)
        agree_seconds = time.perf_counter() - start + (0.0 if before else rider_seconds)
        if n % _BLOCK:
            way = "before" if before else "after"
            seen.setdefault(f"agreement, {way}", []).append(agree_seconds)
            seen.setdefault(f"gradient check, DDP, {way}", []).append(grad_seconds)
    if pending is not None:
        pending.rows()
    return {k: statistics.median(v) for k, v in seen.items()}
