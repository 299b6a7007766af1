"""A tiny GPT-2 (built from a config, nothing downloaded) trained by GoodputTrainer with AdamW and a cosine
LR schedule; run under ``goodput launch`` or ``goodput verify-resume``.

    goodput launch --run-dir RUN -- tests/scripts/hf_train.py STEPS
    goodput verify-resume --nproc 2 --kills 2 -- tests/scripts/hf_train.py STEPS

Each rank appends ``attempt step sample...`` for every trained batch to ``RUN/samples-rank<r>.txt`` (fsynced).
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

import goodput as gp
from goodput.integrations.hf import GoodputTrainer

DATASET = 48


class Tokens(torch.utils.data.Dataset):
    """Sample i: 8 tokens derived from i, and i itself (to record which samples were trained)."""

    def __len__(self) -> int:
        return DATASET

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = torch.tensor([(i * 7 + k) % 32 for k in range(8)])
        return {"input_ids": ids, "labels": ids, "idx": i}


def collate(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([torch.as_tensor(s[key]) for s in samples]) for key in samples[0]}


class Recorded(GPT2LMHeadModel):
    """GPT-2 that writes down the samples of every batch it trains on."""

    log_path = ""
    attempt = -1
    step = 0

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, idx: torch.Tensor) -> Any:
        if self.training:
            Recorded.step += 1
            with open(Recorded.log_path, "a") as f:
                f.write(f"{Recorded.attempt} {Recorded.step} {' '.join(map(str, idx.tolist()))}\n")
                f.flush()
                os.fsync(f.fileno())
        return super().forward(input_ids=input_ids, labels=labels)


def main() -> None:
    steps = int(sys.argv[1])
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    random.seed(0)  # verify-resume compares every generator, so seed them all
    np.random.seed(0)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    model = Recorded(config)
    args = TrainingArguments(
        output_dir=os.path.join(run_dir, "out"),
        max_steps=steps,
        save_steps=4,
        optim="adamw_torch",
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        logging_steps=1000,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    # after TrainingArguments, which joins the process group: each rank reads its share
    loader = gp.ResumableLoader(Tokens(), batch_size=4, seed=5, drop_last=True, collate_fn=collate)
    trainer = GoodputTrainer(model=model, args=args, goodput_loader=loader)
    Recorded.log_path = os.path.join(run_dir, f"samples-rank{trainer.goodput_callback.rank}.txt")
    Recorded.attempt = trainer.goodput_callback.ledger.attempt
    resume = trainer.resume_path
    Recorded.step = int(resume.rsplit("-", 1)[1]) if resume else 0
    trainer.train(resume_from_checkpoint=resume)


if __name__ == "__main__":
    main()
