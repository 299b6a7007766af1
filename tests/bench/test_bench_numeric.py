"""`goodput bench numeric`'s in-step timing (no timing asserted): on 2 real gloo ranks it runs both ways in
alternating blocks of real DDP steps, checks that every word it reads back is every rank's, and returns every
figure it prints."""

from __future__ import annotations

import math

import torch

from goodput.bench._numeric_steps import in_step_costs
from goodput.testing.dist import run_ranks


def _costs(rank: int, world: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 32)

    def backward() -> None:
        model(x).square().mean().backward()

    def optimize() -> None:
        opt.step()
        opt.zero_grad()

    return in_step_costs(model, backward, optimize, torch.distributed.new_group(backend="gloo"), 24)


def test_both_ways_are_timed_in_real_steps() -> None:
    for costs in run_ranks(_costs, 2, timeout=120):
        assert set(costs) == {
            "agreement, before", "agreement, after", "gradient check, DDP, before", "gradient check, DDP, after",
        }  # fmt: skip
        assert all(math.isfinite(v) for v in costs.values()), costs
        assert costs["gradient check, DDP, after"] > 0 and costs["agreement, before"] > 0
