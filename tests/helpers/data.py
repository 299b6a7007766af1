"""Small module-level datasets for the data-pipeline tests (DataLoader workers must be able to use them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch


class Squares:
    """Sample i is the tensor [i, i*i]; records which indices the main process fetched (workers=0)."""

    def __init__(self, n: int, fingerprint: str | None = None) -> None:
        self.n = n
        self.fetched: list[int] = []
        if fingerprint is not None:
            self.fingerprint = fingerprint

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        self.fetched.append(i)
        return torch.tensor([i, i * i])


class Slow(Squares):
    """Each sample takes ``delay`` seconds to load (a workload, as remote reads are)."""

    def __init__(self, n: int, delay: float) -> None:
        super().__init__(n)
        self.delay = delay

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        return super().__getitem__(i)


class Watched(Squares):
    """Lets a test wait (without sleeping) until a thread has fetched some number of samples (workers=0)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.changed = threading.Condition()

    def __getitem__(self, i: int) -> torch.Tensor:
        with self.changed:
            sample = super().__getitem__(i)
            self.changed.notify_all()
        return sample

    def wait_fetched(self, count: int, timeout: float = 30.0) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.fetched) >= count, timeout=timeout)


class Batched:
    """A whole batch in one call (``__getitems__``): cheap enough for datasets of millions of samples."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: Sequence[int]) -> torch.Tensor:
        self.calls.append(len(indices))
        return torch.as_tensor(list(indices))


class Seeded(Squares):
    """Takes per-sample seeds: sample is [index, seed]."""

    def get_seeded(self, index: int, seed: int) -> torch.Tensor:
        return torch.tensor([index, seed])


class Prefetching(Squares):
    """Records the indices the loader announces through the prefetch hook."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.announced: list[list[int]] = []

    def prefetch(self, indices: Sequence[int]) -> None:
        self.announced.append(list(indices))


class Sharded(Squares):
    """Shards of the given sizes, contiguous in index order."""

    def __init__(self, shard_sizes: Sequence[int]) -> None:
        super().__init__(sum(shard_sizes))
        self.shard_sizes = list(shard_sizes)


def ids(batch: torch.Tensor) -> list[int]:
    """The sample indices of a batch of Squares/Seeded samples."""
    return [int(v) for v in batch[:, 0]]


def keep(batch: object) -> object:
    """A collate function that returns what the dataset gave."""
    return batch


class WorkerSeed(Squares):
    """Sample is [index, the loading worker's seed] (-1 in the main process)."""

    def __getitem__(self, i: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        return torch.tensor([i, info.seed if info is not None else -1])


class Augmented(Squares):
    """Worker-side random augmentation from the per-sample generator: sample is [index, noise1, noise2]."""

    def get_seeded(self, index: int, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        noise = torch.rand(2, generator=g, dtype=torch.float64)
        return torch.cat([torch.tensor([float(index)], dtype=torch.float64), noise])
