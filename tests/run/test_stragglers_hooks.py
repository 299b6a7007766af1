"""The straggler detector beside the numeric guard on one DDP model (DDP takes a single communication hook: both
ride one, goodput.run._comm_hook), on 2 real gloo ranks."""

from __future__ import annotations

import math

import torch

from goodput.run.numeric.grads import BucketCheck
from goodput.run.stragglers import StragglerConfig, StragglerMonitor
from goodput.testing.dist import run_ranks


def _both_on_one_model(rank: int, world: int) -> tuple[float | None, float]:
    """One DDP step with the detector attached first (as ``Run.restore`` does) and the guard second; rank 1's
    input holds a NaN away from the bucket's first element."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 4))
    monitor = StragglerMonitor(
        StragglerConfig(), rank=rank, world_size=world, record=lambda *a, **k: None, export=lambda s, m: None
    )
    assert monitor.attach(model)
    check = BucketCheck.install(model, torch.distributed.new_group(backend="gloo"))
    assert check is not None, "the numeric guard fell back from the bucket check"
    x = torch.ones(2, 64)
    if rank == 1:
        x[1, 37] = math.nan
    monitor.handed()
    model(x).sum().backward()
    monitor.step_done(1, 0.0)
    return check.take(), monitor._rows[-1][2]


def test_the_numeric_guard_and_the_detector_share_ddps_one_hook() -> None:
    results = run_ranks(_both_on_one_model, 2, timeout=120)
    # the guard's bucket sum: every rank sees rank 1's NaN through the all-reduce
    assert all(total is not None and not math.isfinite(total) for total, _ in results), results
    # the detector's bucket timing: each rank's wait from its bucket ready to the all-reduce done
    assert all(wait > 0.0 for _, wait in results), results


def _exchange_rank(rank: int, world: int) -> list[list[list[float]]]:
    from goodput.run.stragglers.monitor import Exchange

    exchange = Exchange(3, rank, world)
    seen = []
    for window in range(3):  # the buffer is reused: an old window's rows must not leak into the next
        exchange.start(
            [rank + 0.1 * window, -1.0 / 3.0 * (rank + 1), 1e-9 * (window + 1)] if rank else [0.0] * 3
        )
        seen.append(exchange.result())
    return seen


def test_the_exchange_leaves_every_ranks_row_on_every_rank_bit_for_bit_window_after_window() -> None:
    results = run_ranks(_exchange_rank, 3)
    expected = [
        [[0.0] * 3] + [[r + 0.1 * w, -1.0 / 3.0 * (r + 1), 1e-9 * (w + 1)] for r in (1, 2)] for w in range(3)
    ]
    assert results == [expected] * 3
