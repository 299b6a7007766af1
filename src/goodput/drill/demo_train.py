"""The drill's built-in training: a small MLP with dropout on a fixed regression set, DDP over gloo, goodput.Run.

Run by ``goodput drill`` when no script is given; by hand:

    goodput launch --nproc 2 --run-dir runs/d --restart warm -- src/goodput/drill/demo_train.py --steps 40

It is written as the README's loop, with what every drill scenario needs turned on: asynchronous DCP saves
every ``--every`` steps, the numeric guard (spikes judged after a short warm-up, replicas compared every
``--every`` steps, so ``nan``, ``spike`` and ``bitflip`` are caught), a short hang timeout, and ``run.warm`` so a
warm restart keeps the survivors' processes. Deterministic (seeded, deterministic algorithms, one thread), so
an interrupted run can end bit for bit equal to an uninterrupted one.
"""

from __future__ import annotations

import argparse
import os
import random

import numpy as np
import torch

import goodput as gp


class Points(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """512 points with 16 features and a noisy linear target, the same on every rank and every run."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(512, 16, generator=g)
        self.y = self.x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=4, help="save every N steps (default 4)")
    p.add_argument("--strategy", default="dcp_async", help="checkpoint strategy (default dcp_async)")
    p.add_argument(
        "--hang-timeout", type=float, default=10.0, help="seconds without a step: hung (default 10)"
    )
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank (default 0)")
    p.add_argument(
        "--global-batch", type=int, default=0,
        help="samples per step over all ranks, kept through a shrink or a grow (default 0: 8 per rank)",
    )  # fmt: skip
    p.add_argument(
        "--spike-k", type=float, default=6.0, help="the spike rule's sigmas (default 6, NumericConfig's)"
    )
    return p.parse_args()


def main() -> None:
    args = _args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    numeric = gp.NumericConfig(
        spike_warmup=min(20, args.steps // 3), check_every=args.every, spike_k=args.spike_k
    )
    run = gp.Run(
        checkpoint=gp.CheckpointConfig(
            root=os.path.join(run_dir, "checkpoints"), strategy=args.strategy, every=args.every, keep_last=2
        ),
        total_steps=args.steps,
        hang_timeout=args.hang_timeout,
        numeric=numeric,
        progress=False,
        backend="gloo",  # a CPU model, also on a machine with GPUs
    )
    dataset = Points()
    run.warm(lambda r: _train(r, args, dataset))


def _train(run: gp.Run, args: argparse.Namespace, dataset: Points) -> None:
    """One entry of the training (again in the same process after a warm restart)."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1)
    )
    model = torch.nn.parallel.DistributedDataParallel(net) if run.info.world_size > 1 else net
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.steps)
    loader = gp.ResumableLoader(
        dataset, batch_size=None if args.global_batch else 8, global_batch_size=args.global_batch or None, seed=0,
        num_workers=args.workers, drop_last=True,
    )  # fmt: skip
    run.restore(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
    for x, y in run.batches(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        run.step_done(loss=loss.item())
    run.close()


if __name__ == "__main__":
    main()
