"""A user's training script with a leak the soak must find: it opens a file at every step and never closes it.

goodput drill --soak --replay soak-replay.json -- tests/scripts/leaky_train.py --steps 4000
"""

import argparse
import os

import torch

import goodput as gp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4000)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    run = gp.Run(
        checkpoint=gp.CheckpointConfig(root=os.path.join(run_dir, "checkpoints"), every=500),
        total_steps=args.steps,
        progress=False,
        backend="gloo",  # a CPU model, also on a machine with GPUs
    )
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = gp.ResumableLoader(data, batch_size=8, seed=0, drop_last=True)
    run.restore(model=model, optimizer=opt, loader=loader)
    opened = []
    for x, y in run.batches(loader):
        opened.append(open(os.devnull))  # noqa: SIM115 (the leak: one open file more at every step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        run.step_done(loss=loss.item())
    run.close()


if __name__ == "__main__":
    main()
