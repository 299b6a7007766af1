"""A single-process Lightning fit through goodput that logs how Lightning numbers each step, for resume tests.

    GOODPUT_RUN_DIR=RUN python tests/scripts/lightning_resume.py MAX_STEPS [tqdm|rich]

24 samples in batches of 4: 6 batches an epoch, a checkpoint every 4 steps. Each trained batch appends
``{"step", "epoch", "batch_idx"}`` (Lightning's global step after it, ``current_epoch``, the batch's index in
the epoch) to ``RUN/batches.jsonl``; with a progress bar named, also ``"bar"``: its description and
``done/total`` after the batch, as the user sees them.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar

import goodput as gp
from goodput.integrations.lightning import GoodputCallback, GoodputDDPStrategy


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Numbering(pl.Callback):
    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        line = {"step": trainer.global_step, "epoch": trainer.current_epoch, "batch_idx": batch_idx}
        if trainer.progress_bar_callback is not None:
            line["bar"] = _shown(trainer.progress_bar_callback)
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")


def _shown(bar: ProgressBar) -> str:
    """The training bar's description and ``done/total`` (None: unknown) as the user sees them."""
    if isinstance(bar, RichProgressBar):
        assert bar.progress is not None
        task = next(t for t in bar.progress.tasks if t.id == bar.train_progress_bar_id)
        return f"{task.description.strip()} {int(task.completed)}/{task.total}"
    assert isinstance(bar, TQDMProgressBar)
    tqdm = bar.train_progress_bar
    return f"{tqdm.desc} {tqdm.n}/{tqdm.total}"


def main() -> None:
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    pl.seed_everything(0, verbose=False)
    bars = {"tqdm": TQDMProgressBar, "rich": RichProgressBar}
    bar = [bars[sys.argv[2]]()] if len(sys.argv) > 2 else []
    data = torch.randn(24, 4, generator=torch.Generator().manual_seed(0))
    goodput_cb = GoodputCallback(
        checkpoint=gp.CheckpointConfig(root=os.path.join(run_dir, "ckpt"), strategy="torch_save", every=4),
        loader=gp.ResumableLoader(data, batch_size=4, seed=3, drop_last=True),
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=GoodputDDPStrategy(checkpoint_io=goodput_cb.checkpoint_io, process_group_backend="gloo"),
        callbacks=[goodput_cb, *bar, Numbering(os.path.join(run_dir, "batches.jsonl"))],
        max_steps=int(sys.argv[1]),
        use_distributed_sampler=False,
        enable_checkpointing=False,
        enable_progress_bar=bool(bar),
        enable_model_summary=False,
        logger=False,
    )
    trainer.fit(Tiny(), train_dataloaders=goodput_cb.loader, ckpt_path=goodput_cb.resume_path)


if __name__ == "__main__":
    main()
