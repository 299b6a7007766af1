"""Resume cost in the Hugging Face Trainer: its own skip of trained batches against goodput's O(1) position.

On resume, ``Trainer._run_epoch`` calls accelerate's ``skip_first_batches(train_dataloader, n)`` on the
dataloader the Trainer built (``get_train_dataloader``: accelerate-prepared, shuffled) and then iterates: every
skipped batch is drawn from its sampler before the first trained one. goodput's loader restores its position
from a ~170-byte dict and computes where to start. Both are timed from "resume at sample P" to the first batch
in hand, over the same map-style dataset and collate function (the fetch of one batch is in both); the same
with P = 0 shows what a fresh start costs (the Trainer's dataloader pays much of it at any P: its
accelerate wrapper draws the epoch's order up front), and ``hf_skip_only_seconds`` is the difference. Needs ``transformers`` and ``accelerate`` (``goodput[hf]``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import time
from typing import Any

__all__ = ["available", "hf_resume"]

_BATCH = 8


def available() -> str | None:
    """None when the scenario can run; else why not."""
    missing = [m for m in ("transformers", "accelerate") if importlib.util.find_spec(m) is None]
    return f"needs {' and '.join(missing)} (pip install 'goodput[hf]')" if missing else None


class _Tokens:
    """``n`` samples of 16 tokens each, derived from the index (cheap, like a pre-tokenised corpus)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        ids = torch.arange(i, i + 16) % 64
        return {"input_ids": ids, "labels": ids}


def _trainer(dataset: _Tokens, folder: str) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(
        output_dir=folder, per_device_train_batch_size=_BATCH, report_to=[], use_cpu=True, disable_tqdm=True
    )
    return Trainer(model=model, args=args, train_dataset=dataset)


def hf_resume(position: int = 100_000, repeats: int = 5) -> dict[str, Any]:
    """Seconds to the first batch after a resume at sample ``position``: the Trainer's way and goodput's."""
    from accelerate import skip_first_batches
    from transformers import default_data_collator

    from goodput.data import ResumableLoader

    dataset = _Tokens(2 * position)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory(prefix="goodput-bench-hf-") as folder:
        trainer = _trainer(dataset, folder)

        def hf(at: int) -> float:
            loader = trainer.get_train_dataloader()  # what train() builds, then skips on resume
            start = time.perf_counter()
            if at:
                loader = skip_first_batches(loader, at // _BATCH)
            next(iter(loader))
            return time.perf_counter() - start

        def ours(at: int) -> float:
            loader = ResumableLoader(dataset, batch_size=_BATCH, seed=0, collate_fn=default_data_collator)
            text = json.dumps({**loader.state_dict(), "consumed": at})
            start = time.perf_counter()
            loader.load_state_dict(json.loads(text))
            next(iter(loader))
            return time.perf_counter() - start

        times: dict[str, list[float]] = {"hf": [], "hf_fresh": [], "goodput": [], "goodput_fresh": []}
        for _ in range(repeats):  # interleaved, so that load from elsewhere hits all alike
            times["hf"].append(hf(position))
            times["hf_fresh"].append(hf(0))
            times["goodput"].append(ours(position))
            times["goodput_fresh"].append(ours(0))
    best = {name: min(values) for name, values in times.items()}
    return {
        "position": position,
        "batch": _BATCH,
        "hf_skip_seconds": best["hf"],
        "hf_fresh_start_seconds": best["hf_fresh"],
        "goodput_seconds": best["goodput"],
        "goodput_fresh_start_seconds": best["goodput_fresh"],
        "hf_skip_only_seconds": max(0.0, best["hf"] - best["hf_fresh"]),
        "ratio": best["hf"] / best["goodput"],
    }
