"""The resumable, overlapped data pipeline: exactly-once samples across crashes, workers and world sizes.

``order`` (pure: the sample order and its split over ranks), ``sampler`` (the data position), ``loader``
(ResumableLoader over torch's DataLoader, fetch_seconds) and ``prefetch`` (DevicePrefetcher).
"""

from __future__ import annotations

from goodput.data.loader import FetchTimes, LoaderConfig, ResumableLoader
from goodput.data.order import EpochOrder, rank_batch_count, rank_batch_range, sample_seed, sample_seeds
from goodput.data.prefetch import DevicePrefetcher
from goodput.data.sampler import BatchPlan, ResumableSampler

__all__ = [
    "BatchPlan",
    "DevicePrefetcher",
    "EpochOrder",
    "FetchTimes",
    "LoaderConfig",
    "ResumableLoader",
    "ResumableSampler",
    "rank_batch_count",
    "rank_batch_range",
    "sample_seed",
    "sample_seeds",
]
