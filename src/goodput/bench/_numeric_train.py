"""A small guarded DDP training for ``goodput bench numeric``'s drill: memory tier every step, DCP every 8.

    goodput launch --nproc 2 --run-dir DIR --faults 'nan@step=6,rank=1' -- src/goodput/bench/_numeric_train.py

The numeric guard runs at its defaults except a short spike warm-up and ``--check-every`` (8), so a short run
reaches every detector.
"""

from __future__ import annotations

import argparse
import os

import torch

import goodput as gp


class _Rows(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.arange(16, dtype=torch.float32) / 16 + index / 4096


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--check-every", type=int, default=8)
    args = p.parse_args()
    torch.manual_seed(0)
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    memory = gp.MemoryTier(every=1, keep=2, folder=os.path.join(run_dir, "ram"))
    config = gp.CheckpointConfig(
        root=os.path.join(run_dir, "checkpoints"), strategy="dcp", every=8, memory=memory
    )
    numeric = gp.NumericConfig(check_every=args.check_every, spike_warmup=4, spike_window=20)
    run = gp.Run(total_steps=args.steps, checkpoint=config, progress=False, backend="gloo", numeric=numeric)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = gp.ResumableLoader(_Rows(), batch_size=4, seed=0, drop_last=True)
    run.restore(model=model, optimizer=opt, loader=loader)
    for batch in run.batches(loader):
        # + 1: a part no model can fit, as a real loss has (the data's entropy); without it this toy's loss
        # falls towards 0 and varies by factors from step to step, which a spike must exceed
        loss = model(batch).pow(2).mean() + 1.0
        loss.backward()
        opt.step()
        opt.zero_grad()
        run.step_done(loss=loss.item())
    run.close()


if __name__ == "__main__":
    main()
