"""The demo's data augmentation: random byte noise drawn in the DataLoader workers from per-sample generators.

Each sample's noise comes from the generator ``ResumableLoader`` hands the dataset through its ``get_seeded``
hook (the same as ``goodput.sample_rng(index, epoch, seed)``), so it depends only on the sample, the epoch and
the seed: not on which worker or rank loads it, nor on where the run was resumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["ByteNoise"]


class ByteNoise:
    """Wraps a dataset of ``(sample_id, uint8 tokens)``; replaces each byte by a random one with probability p.

    Args:
        dataset: the demo's ``ShardedDataset`` (its ``prefetch``, ``fingerprint``, ``shard_sizes``, ``close``,
            ``cache_metrics`` and ``cache_usage`` are passed on).
        p: the probability that a byte is replaced (0: no augmentation).
    """

    def __init__(self, dataset: Any, p: float) -> None:
        if not 0.0 <= p < 1.0:
            raise ValueError(f"the byte-noise probability must be in [0, 1), got {p}")
        self.dataset = dataset
        self.p = p
        self.shard_sizes = dataset.shard_sizes  # the shard-aware order of ``ResumableLoader(shard_window=k)``
        self.fingerprint = f"{dataset.fingerprint}:noise={p}"

    def __len__(self) -> int:
        return len(self.dataset)

    def get_seeded(self, index: int, seed: int) -> tuple[int, torch.Tensor]:
        """Sample ``index`` with noise from the generator of ``seed`` (the loader's per-sample seed)."""
        sample_id, tokens = self.dataset[index]
        g = torch.Generator().manual_seed(seed)
        replace = torch.rand(tokens.shape, generator=g) < self.p
        noise = torch.randint(0, 256, tokens.shape, generator=g, dtype=tokens.dtype)
        return sample_id, torch.where(replace, noise, tokens)

    def prefetch(self, indices: Sequence[int]) -> None:
        self.dataset.prefetch(indices)

    def cache_metrics(self) -> dict[str, float]:
        return dict(self.dataset.cache_metrics())

    def cache_usage(self) -> dict[str, Any]:
        return dict(self.dataset.cache_usage())

    def close(self) -> None:
        self.dataset.close()
