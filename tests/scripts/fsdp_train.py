"""A model-sharded training script for the drill: a small MLP with dropout, FSDP2 (``fully_shard``) over gloo.

goodput drill --scenarios rank --nproc 2 -- tests/scripts/fsdp_train.py --steps 12 --every 3

Written as the README's loop with the model sharded: every rank holds half of each parameter, so a restore
reads the shards from DCP (no rank holds a replica to copy from). Synchronous DCP saves every ``--every`` steps
(the rank scenario then needs no upload kill, which keeps its test short). Deterministic: seeded,
deterministic algorithms, one thread.
"""

import argparse
import os
import random

import numpy as np
import torch
from _readme_loop import Points, fit
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import goodput as gp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    root = os.path.join(os.environ["GOODPUT_RUN_DIR"], "checkpoints")
    run = gp.Run(
        checkpoint=gp.CheckpointConfig(root=root, strategy="dcp", every=args.every),
        total_steps=args.steps,
        progress=False,
        backend="gloo",
    )
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1)
    )
    mesh = init_device_mesh("cpu", (run.info.world_size,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.steps)
    loader = gp.ResumableLoader(Points(seed=99), batch_size=8, seed=0, drop_last=True)
    run.restore(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
    fit(run, loader, lambda b: torch.nn.functional.mse_loss(model(b[0]), b[1]), optimizer, scheduler)


if __name__ == "__main__":
    main()
