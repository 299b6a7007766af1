"""A user's DDP training with dropout, written from the README and docs/warm-restarts.md alone: its loop is one
function given to ``run.warm``, and its loader keeps the global batch on every world size.

    goodput verify-resume --restart warm --spares 0 --shrink-after 0 --nproc 3 --kills 2 -- \
        tests/scripts/dropout_warm_train.py --steps 8

Every step draws a dropout mask from torch's generator on every rank, so its loss depends on each rank's random
stream: after a shrink, the reference's cold resume on fewer ranks matches only if the survivors' streams are
the ones such a resume gives (docs/warm-restarts.md).
"""

import argparse
import os

import numpy as np
import torch
from _readme_loop import Points, fit

import goodput as gp


def train(run: gp.Run, steps: int) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1)
    )
    model = torch.nn.parallel.DistributedDataParallel(net) if run.info.world_size > 1 else net
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    loader = gp.ResumableLoader(Points(n=240), global_batch_size=12, seed=0, drop_last=True)
    run.restore(model=model, optimizer=opt, scheduler=sched, loader=loader)
    fit(run, loader, lambda b: torch.nn.functional.mse_loss(model(b[0]), b[1]), opt, sched)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument(
        "--hang-timeout", type=float, default=300.0, help="Run(hang_timeout=): seconds without a step"
    )
    p.add_argument("--numeric", action="store_true", help="Run(numeric=True): the guard at its defaults")
    args = p.parse_args()
    run = make_run(args.steps, hang_timeout=args.hang_timeout, numeric=args.numeric)
    run.warm(lambda r: train(r, args.steps))


def make_run(steps: int, *, hang_timeout: float = 300.0, numeric: bool = False) -> gp.Run:
    """The script's ``Run``: a checkpoint every 2 steps in the launch's run folder, deterministic kernels."""
    np.random.seed(0)
    torch.use_deterministic_algorithms(True)
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    return gp.Run(
        checkpoint=gp.CheckpointConfig(root=os.path.join(run_dir, "checkpoints"), every=2),
        total_steps=steps,
        hang_timeout=hang_timeout,
        numeric=numeric,
        backend="gloo",  # a CPU model, also on a machine with GPUs
    )


if __name__ == "__main__":
    main()
