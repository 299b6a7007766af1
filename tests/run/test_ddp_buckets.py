"""A DDP run resumed from a checkpoint trains bit for bit as the uninterrupted run, on 3 and 4 real gloo ranks
(goodput.run._ddp_buckets): with three ranks or more a gradient bucket laid out otherwise, or a collective of
another length, sums some elements in another order, so the resumed attempt's first step must reduce its
gradients as the uninterrupted run did there. On 3 ranks: plain DDP, DDP with the user's own comm hook and a
``no_sync`` micro-batch, and ``static_graph=True``; on 4 ranks: the numeric guard on (its word rides the first
bucket), and a model larger than DDP's first bucket (1 MiB: DDP rebuilds it into two buckets after the first
backward, the second with ``static_graph``), alone, with the guard and with ``static_graph=True``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

import goodput as gp
from goodput.testing import free_port
from goodput.testing.dist import run_ranks

_VARIANTS = ("plain", "user_hook_no_sync", "static_graph")
_VARIANTS_4 = ("numeric", "large", "large_numeric", "large_static_graph")


class _Net(torch.nn.Module):
    """Two layers of four parameter tensors: the ready order of their gradients is not the first layout's."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3)
        self.fc = torch.nn.Linear(8 * 10 * 10, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class _Wide(_Net):
    """``_Net`` with a hidden layer of 1.2 MiB: DDP rebuilds its buckets into two after the first backward."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(8 * 10 * 10, 400)
        self.fc = torch.nn.Linear(400, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.hidden(torch.relu(self.conv(x)).flatten(1))))


def _batch(rank: int, step: int, part: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + part)
    return torch.randn(8, 1, 12, 12, generator=g), torch.randint(0, 2, (8,), generator=g)


def _train(rank: int, variant: str, run_dir: str, ckpt: str, steps: int, group: int) -> list[torch.Tensor]:
    """Train (resuming from ``ckpt`` where it holds a step) until ``steps``; the final parameters. The run makes
    the process group (and ends it): the ``group``-th one of this test meets on its own port."""
    os.environ["MASTER_PORT"] = str(int(os.environ["DDP_BUCKETS_TEST_BASE_PORT"]) + group)
    config = gp.CheckpointConfig(root=ckpt, strategy="dcp", every=100)
    numeric = gp.NumericConfig() if variant.endswith("numeric") else False
    run = gp.Run(
        run_dir, checkpoint=config, total_steps=steps, hang_timeout=None, progress=False, numeric=numeric
    )
    torch.manual_seed(0)  # the group is the run's (it ends with it): the model is made after the run
    net = _Wide() if variant.startswith("large") else _Net()
    ddp = torch.nn.parallel.DistributedDataParallel(net, static_graph=variant.endswith("static_graph"))
    if variant == "user_hook_no_sync":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        ddp.register_comm_hook(None, allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5, momentum=0.9)
    run.restore(model=ddp, optimizer=opt)
    while run.step < steps:
        if variant == "user_hook_no_sync":
            with ddp.no_sync():
                x, y = _batch(rank, run.step, 1)
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
        x, y = _batch(rank, run.step, 0)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        run.step_done(loss=loss.item())
    run.close()
    return [p.detach().clone() for p in ddp.parameters()]


def _resume_against_uninterrupted(
    rank: int, world: int, root: str, variants: tuple[str, ...], base_port: int
) -> dict[str, bool]:
    os.environ["DDP_BUCKETS_TEST_BASE_PORT"] = str(base_port)
    torch.distributed.destroy_process_group()  # each run makes its own
    same = {}
    for i, variant in enumerate(variants):
        base = os.path.join(root, variant)
        whole = _train(
            rank, variant, os.path.join(base, "whole"), os.path.join(base, "ckpt-whole"), 5, 3 * i + 1
        )
        resumed = os.path.join(base, "ckpt-resumed")
        _train(
            rank, variant, os.path.join(base, "first"), resumed, 2, 3 * i + 2
        )  # saved at step 2 on closing
        again = _train(rank, variant, os.path.join(base, "again"), resumed, 5, 3 * i + 3)
        same[variant] = all(torch.equal(a, b) for a, b in zip(whole, again, strict=True))
    return same


def test_a_run_resumed_at_step_2_trains_bit_for_bit_as_the_uninterrupted_one_on_3_ranks(
    tmp_path: Path,
) -> None:
    base = free_port(also=range(1, 3 * len(_VARIANTS) + 1))  # a block: one port per run of this test
    results: list[Any] = run_ranks(
        _resume_against_uninterrupted, 3, str(tmp_path), _VARIANTS, base, timeout=180
    )
    for rank, same in enumerate(results):
        assert same == dict.fromkeys(_VARIANTS, True), f"rank {rank}: final parameters differ: {same}"


def test_a_run_resumed_at_step_2_trains_bit_for_bit_on_4_ranks(
    tmp_path: Path,
) -> None:
    base = free_port(also=range(1, 3 * len(_VARIANTS_4) + 1))
    results: list[Any] = run_ranks(
        _resume_against_uninterrupted, 4, str(tmp_path), _VARIANTS_4, base, timeout=240
    )
    for rank, same in enumerate(results):
        assert same == dict.fromkeys(_VARIANTS_4, True), f"rank {rank}: final parameters differ: {same}"
