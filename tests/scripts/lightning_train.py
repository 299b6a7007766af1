"""A small LightningModule (AdamW, a step-wise LR schedule) trained through goodput's Lightning integration.

    goodput launch --nproc 2 --run-dir RUN -- tests/scripts/lightning_train.py STEPS
    goodput verify-resume --nproc 2 --kills 2 -- tests/scripts/lightning_train.py STEPS

Each rank appends ``attempt step sample...`` for every trained batch to ``RUN/samples-rank<r>.txt`` (fsynced),
so a test can rebuild which samples the surviving history trained on, and at the end writes its final weights,
optimizer state and learning rate to ``RUN/final-rank<r>.pt``.
"""

from __future__ import annotations

import os
import sys

import lightning.pytorch as pl
import torch

import goodput as gp
from goodput.integrations.lightning import GoodputCallback, GoodputDDPStrategy


class Indexed(torch.utils.data.Dataset):
    """Sample i is (i, a feature vector derived from i)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, torch.full((4,), float(i) / 64.0)


class Tiny(pl.LightningModule):
    def __init__(self, log_path: str) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
        self.log_path = log_path
        self.attempt = -1

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        index, x = batch
        with open(self.log_path, "a") as f:
            f.write(f"{self.attempt} {self.trainer.global_step + 1} {' '.join(map(str, index.tolist()))}\n")
            f.flush()
            os.fsync(f.fileno())
        return (self.net(x) - 1.0).pow(2).mean()

    def configure_optimizers(self) -> dict[str, object]:
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main() -> None:
    steps = int(sys.argv[1])
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    pl.seed_everything(0, verbose=False)  # random, numpy and torch: verify-resume compares every generator
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        gp.init_distributed("gloo")  # goodput's group set-up; Lightning sees it and reuses it
    loader = gp.ResumableLoader(Indexed(), batch_size=4, seed=3, drop_last=True)
    goodput_cb = GoodputCallback(
        checkpoint=gp.CheckpointConfig(root=os.path.join(run_dir, "ckpt"), strategy="dcp", every=4),
        loader=loader,
    )
    model = Tiny(os.path.join(run_dir, f"samples-rank{rank}.txt"))
    model.attempt = goodput_cb.ledger.attempt
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=GoodputDDPStrategy(checkpoint_io=goodput_cb.checkpoint_io, process_group_backend="gloo"),
        callbacks=[goodput_cb],
        max_steps=steps,
        use_distributed_sampler=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    trainer.fit(model, train_dataloaders=goodput_cb.loader, ckpt_path=goodput_cb.resume_path)
    optimizer = trainer.optimizers[0]
    final = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr": optimizer.param_groups[0]["lr"],
    }
    torch.save(final, os.path.join(run_dir, f"final-rank{rank}.pt"))


if __name__ == "__main__":
    main()
