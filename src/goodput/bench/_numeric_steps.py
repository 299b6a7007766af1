"""``goodput bench numeric``: the agreement and the DDP gradient check timed inside real DDP steps, the guard's
way (after) against the way it had before (before), in alternating blocks of steps of the same run.

* Agreement, before: each step's word all-gathered on the guard's own gloo group, started at the step's end
  and read at the next (the main thread's issue and wait). After: the word rides the next step's first
  gradient bucket (``run/numeric/carry.py``): the extra time of that bucket's hook (the bucket's averaged copy
  with the word after it, against DDP's own in-place division when no word rides) plus boarding and reading
  the word.
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
    """Taps of DDP's shared hook: the first bucket's hook time, and the before-way's callback sums."""

    def __init__(self) -> None:
        self.before = True
        self.hook0: list[float] = []
        self.sums: list[Any] = []
        self.sum_seconds = 0.0

    def outer(self, bucket: Any, reduce: Any) -> Any:
        start = time.perf_counter()
        future = reduce()
        if bucket.index() == 0:
            self.hook0.append(time.perf_counter() - start)
        return future

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

    from goodput.run._comm_hook import add_tap
    from goodput.run.numeric.exchange import start_gather
    from goodput.run.numeric.grads import BucketCheck
    from goodput.run.numeric.rules import encode_row

    timers = _Timers()
    add_tap(
        model, "bench-outer", timers.outer
    )  # outermost: the numeric tap, the payload, the all-reduce's issue
    check = BucketCheck.install(model, group)
    assert check is not None and check.carrier is not None, "the bench's DDP model carries no word"
    add_tap(model, "bench-inner", timers.inner)
    row = encode_row(1, 2.0, dist.get_rank(), 0.0)
    seen: dict[str, list[float]] = {}
    pending: Any = None
    for n in range(steps):
        before = timers.before = (n // _BLOCK) % 2 == 0
        if n % _BLOCK == 0 and pending is not None:
            pending.rows()  # the other way's last word (a word that never rode is all-gathered)
            pending = None
        timers.hook0.clear()
        timers.sum_seconds = 0.0
        backward()
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
        agree_seconds = time.perf_counter() - start
        if n % _BLOCK:
            way = "before" if before else "after"
            seen.setdefault(f"hook {way}", []).append(timers.hook0[0])
            seen.setdefault(f"agreement, {way}", []).append(agree_seconds)
            seen.setdefault(f"gradient check, DDP, {way}", []).append(grad_seconds)
    if pending is not None:
        pending.rows()
    median = {k: statistics.median(v) for k, v in seen.items()}
    # the word's share of the first bucket's hook: its copy and payload against DDP's in-place division
    median["agreement, after"] += median.pop("hook after") - median.pop("hook before")
    return median
