"""The native loaders the in-place formats are measured against (``goodput bench data --format``).

Each baseline reads the same files as goodput: Hugging Face ``datasets`` (its streaming ``IterableDataset``
over parquet files or a saved dataset, with its ``state_dict``; its map-style ``Dataset``) and torchdata's
``StatefulDataLoader`` (its ``state_dict`` over a map-style dataset). A resume is timed from "restore the
saved state" to the first sample in hand, after the state was taken, untimed, by iterating to the position:
the state's own size is reported as its JSON text, or its pickle where it holds tensors (torchdata's
sampler generator).
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["TokenWindows", "epoch_seconds", "hf_iterable_resume", "stateful_loader_resume"]


class TokenWindows:
    """A nanoGPT-style map-style dataset: window ``i`` of a memory-mapped token file, as an int64 tensor."""

    def __init__(self, path: str, seq_len: int, dtype: str) -> None:
        self.path, self.width, self.dtype = path, seq_len + 1, dtype
        self._tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return int(np.memmap(self.path, dtype=self.dtype, mode="r").shape[0]) // self.width

    def __getitem__(self, index: int) -> Any:
        import torch

        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        start = index * self.width
        return torch.from_numpy(self._tokens[start : start + self.width].astype(np.int64))


def keep_batch(batch: Any) -> Any:
    """A collate function that hands the batch (a list of samples) over as it is."""
    return batch


def _best_resume(make: Callable[[], Any], restore: Callable[[Any], None], repeats: int) -> float:
    """Best time over ``repeats`` to restore a saved state into a fresh ``make()`` and draw its first item."""
    times = []
    for _ in range(repeats):
        fresh = make()
        start = time.perf_counter()
        restore(fresh)
        next(iter(fresh))
        times.append(time.perf_counter() - start)
    return min(times)


def hf_iterable_resume(make: Callable[[], Any], position: int, repeats: int) -> dict[str, Any]:
    """A ``datasets.IterableDataset`` iterated to ``position``, its ``state_dict`` restored into a fresh one."""
    dataset = make()
    for seen, _ in enumerate(dataset, start=1):
        if seen == position:
            break
    text = json.dumps(dataset.state_dict())
    seconds = _best_resume(make, lambda fresh: fresh.load_state_dict(json.loads(text)), repeats)
    return {"seconds": seconds, "state_bytes": len(text), "state_encoding": "json"}


def stateful_loader_resume(
    dataset: Any, position: int, batch: int, repeats: int, shuffle: bool
) -> dict[str, Any]:
    """torchdata's StatefulDataLoader iterated to ``position``, its state restored into a fresh loader."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> Any:
        return StatefulDataLoader(dataset, batch_size=batch, shuffle=shuffle, collate_fn=keep_batch)

    first = loader()
    it = iter(first)
    for _ in range(position // batch):
        next(it)
    state = first.state_dict()
    data = pickle.dumps(state)
    seconds = _best_resume(loader, lambda fresh: fresh.load_state_dict(pickle.loads(data)), repeats)
    return {"seconds": seconds, "state_bytes": len(data), "state_encoding": "pickle"}


def epoch_seconds(batches: Callable[[], Iterable[Any]], samples: int, repeats: int) -> float:
    """Best time over ``repeats`` to draw ``samples`` samples (whole batches) from a fresh iteration."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        drawn = 0
        it: Iterator[Any] = iter(batches())
        while drawn < samples:
            drawn += len(next(it))
        best = min(best, time.perf_counter() - start)
    return best
