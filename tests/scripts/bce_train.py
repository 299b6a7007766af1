"""A user's small-batch classifier written from the README's loop: binary cross entropy on batches of 4, DDP,
goodput.Run with the numeric guard on at its defaults, its loss still falling when the run ends.

goodput drill --nproc 2 --scenarios spike,bitflip -- tests/scripts/bce_train.py [--steps 80] [--batch-size 4]

The loss of 4 samples' cross entropy varies by factors from step to step (a batch of easy samples is near 0, one
hard sample lifts it several times), so the spike rule sees only a large rise on it.
"""

import argparse
import os

import torch
from _readme_loop import fit

import goodput as gp


class Labelled(torch.utils.data.Dataset):
    """512 points with 8 features and a label from a noisy linear rule, the same on every rank and every run."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(512, 8, generator=g)
        logits = self.x @ torch.randn(8, generator=g) + 0.1 * torch.randn(512, generator=g)
        self.y = (logits > 0).float()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--every", type=int, default=10, help="save every N steps")
    p.add_argument("--batch-size", type=int, default=4, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=0.02)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    run = gp.Run(
        checkpoint=gp.CheckpointConfig(
            root=os.path.join(run_dir, "checkpoints"), strategy="dcp", every=args.every
        ),
        total_steps=args.steps,
        numeric=True,
        backend="gloo",
        progress=False,
    )
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = gp.ResumableLoader(Labelled(), batch_size=args.batch_size, seed=0, drop_last=True)
    run.restore(model=model, optimizer=opt, loader=loader)
    fit(
        run,
        loader,
        lambda b: torch.nn.functional.binary_cross_entropy_with_logits(model(b[0]).squeeze(1), b[1]),
        opt,
    )


if __name__ == "__main__":
    main()
