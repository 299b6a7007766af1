"""A user's training script written from the README's loop alone: its own model, dataset, DDP, Run.

goodput verify-resume --nproc 2 --kills 2 -- tests/scripts/verify_user_train.py --steps 24
goodput drill --soak --replay soak-replay.json -- tests/scripts/verify_user_train.py --broken leak --steps 100000

``--broken rand`` adds noise from a torch generator seeded from the clock (randomness outside the checkpointed
state); ``--broken loader`` keeps the loader's position out of the checkpoint (a loader outside ``Run``);
``--broken leak`` opens a file at every step and never closes it (the leak a soak must find).
``--python-random unused`` leaves Python's ``random`` unseeded and never draws from it (a script that seeds only
what it uses); ``--python-random drawn`` leaves it unseeded and draws from it at every step.
"""

import argparse
import os
import random

import numpy as np
import torch
from _readme_loop import Points, fit

import goodput as gp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--broken", choices=["rand", "loader", "leak"], default=None)
    p.add_argument("--python-random", choices=["seeded", "unused", "drawn"], default="seeded")
    args = p.parse_args()
    if args.python_random == "seeded":
        random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    run = gp.Run(
        checkpoint=gp.CheckpointConfig(root=os.path.join(run_dir, "checkpoints"), every=4),
        total_steps=args.steps,
        backend="gloo",  # a CPU model, also on a machine with GPUs
    )
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps)
    loader = gp.ResumableLoader(Points(), batch_size=8, seed=0, num_workers=1, drop_last=True)
    clock = torch.Generator()
    clock.seed()  # a seed from the clock: never the same twice
    run.restore(
        model=model, optimizer=opt, scheduler=sched, loader=None if args.broken == "loader" else loader
    )
    opened = []

    def loss_of(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        if args.broken == "leak":
            opened.append(open(os.devnull))  # noqa: SIM115 (the leak: one open file more at every step)
        if args.broken == "rand":
            x = x + 1e-3 * torch.rand(x.shape, generator=clock)
        if args.python_random == "drawn" and random.random() < 0.0:  # drawn, never applied: p = 0
            x = -x
        return torch.nn.functional.mse_loss(model(x), y)

    fit(run, loader, loss_of, opt, sched)


if __name__ == "__main__":
    main()
