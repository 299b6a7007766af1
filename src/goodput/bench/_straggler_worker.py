"""A README-style DDP loop for the straggler benchmark and tests, slowed (or not) by the user's own code.

goodput launch --nproc 2 --run-dir DIR [--restart warm --spares 1] [--faults 'slow@rank=1,factor=1.5,persist']
    -- src/goodput/bench/_straggler_worker.py [--steps 40] [--base 0.01] [--slow-rank 1] [--slow-in forward|data]
    [--factor 1.5] [--every 5] [--windows 3] [--stop] [--replace] [--fsdp]

Each step costs ``--base`` seconds of the user's own work (a sleep in the model's forward); ``--slow-rank`` makes
that rank's forward (or its dataset's item) take ``--factor`` times as long, as a slow GPU or a slow disk would.
"""

import argparse
import os
import time
from typing import Any

import torch

import goodput as gp

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--base", type=float, default=0.01)
p.add_argument("--slow-rank", type=int, default=None)
p.add_argument("--slow-in", choices=("forward", "data"), default="forward")
p.add_argument("--factor", type=float, default=1.5)
p.add_argument("--every", type=int, default=5)
p.add_argument("--windows", type=int, default=None)  # None: StragglerConfig's default
p.add_argument("--stop", action="store_true")
p.add_argument("--replace", action="store_true")
p.add_argument("--fsdp", action="store_true")
args = p.parse_args()

windows = {} if args.windows is None else {"windows": args.windows}
config = gp.StragglerConfig(every=args.every, stop=args.stop, replace=args.replace, **windows)
# A fixed interval: ``auto`` saves more often after a failure, which would make a replaced run's throughput
# measure the checkpoint cadence instead of the ranks' speed.
ckpt = gp.CheckpointConfig(root=os.path.join(os.environ["GOODPUT_RUN_DIR"], "checkpoints"), every=50)
run = gp.Run(
    total_steps=args.steps,
    hang_timeout=60,
    progress=False,
    backend="gloo",
    stragglers=config,
    checkpoint=ckpt,
)
rank = run.info.rank
slow = rank == args.slow_rank
extra = args.base * (args.factor - 1.0) if slow else 0.0


class Slow(torch.nn.Module):
    """A linear layer whose forward takes ``--base`` seconds (and more on the slow rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(args.base + (extra if args.slow_in == "forward" else 0.0))
        return self.linear(x)


class Data(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> torch.Tensor:
        if args.slow_in == "data" and extra:
            time.sleep(extra / 2)  # two items a batch
        return torch.full((4,), index / 4096)


def train(run: gp.Run) -> None:
    net = Slow()
    if args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model: Any = fully_shard(net, mesh=init_device_mesh("cpu", (run.info.world_size,)))
    else:
        model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = gp.ResumableLoader(Data(), batch_size=2, seed=0, drop_last=True)
    run.restore(model=model, optimizer=opt, loader=loader)
    for batch in run.batches(loader):
        with run.section("step"):
            loss = model(batch).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        run.step_done(loss=loss.item())
    run.close()


run.warm(train)
