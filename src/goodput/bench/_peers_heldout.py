"""The held-out slice of ``goodput bench peers``: the corpus's last samples, which no contender trains on, and
the loss of each run's final model on them, so that a row shows the model's quality beside its time.

The bench writes the corpus in two folders: every contender trains on ``data`` (all but the last
``HELDOUT`` samples, whatever order its loader reads them in and however many epochs it runs), and the last
``HELDOUT`` samples go to ``heldout`` alone. A sample keeps its corpus id in both, so the two never share one.
"""

from __future__ import annotations

import os

__all__ = ["HELDOUT", "heldout_loss", "write_split"]

HELDOUT = 1024  # samples: 3% of the demo corpus
_BATCH = 256


def write_split(work: str, *, limit: int = 2 * 2**20) -> tuple[str, str]:
    """The demo corpus (``limit`` bytes) as ``<work>/data`` for training and ``<work>/heldout``; both paths."""
    from goodput.demo.prepare import write_corpus

    data, heldout = os.path.join(work, "data"), os.path.join(work, "heldout")
    write_corpus(data, limit=limit, keep=slice(None, -HELDOUT))
    write_corpus(heldout, limit=limit, keep=slice(-HELDOUT, None))
    return data, heldout


def heldout_loss(run_dir: str, heldout: str) -> float | None:
    """The mean next-byte cross-entropy of the run's final model (``<run_dir>/final-model.pt``) over the held-out
    samples, without dropout; None for a run without a final model or a ``heldout`` folder that does not exist
    (a ``--reference`` folder written before the split)."""
    import torch

    from goodput.data import ShardedDataset
    from goodput.demo.model import ModelConfig, TinyLM
    from goodput.demo.train import FINAL_MODEL, collate, decode, next_byte_loss

    path = os.path.join(run_dir, FINAL_MODEL)
    if not (os.path.exists(path) and os.path.isdir(heldout)):
        return None
    model = TinyLM(ModelConfig(dropout=0.1))
    model.load_state_dict(torch.load(path, weights_only=True))
    model.eval()
    dataset = ShardedDataset(heldout, decode=decode)
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(dataset), _BATCH):
            _, batch = collate([dataset[i] for i in range(start, min(start + _BATCH, len(dataset)))])
            total += float(next_byte_loss(model, torch.from_numpy(batch))) * len(batch)
    return round(total / len(dataset), 4)
