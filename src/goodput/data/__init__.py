"""The resumable, overlapped data pipeline: exactly-once samples across crashes, workers and world sizes.

``order`` (pure: the sample order and its split over ranks), ``sampler`` (the data position), ``loader``
(ResumableLoader over torch's DataLoader, fetch_seconds), ``prefetch`` (DevicePrefetcher) and ``randomness``
(per-sample generators, the loader's own generator); ``cache`` (remote
storage through a local cache), ``shards`` (the sharded format, its writer and reader), ``folder`` (one sample
per file) and the formats read in place: ``parquet``, ``arrow`` (Hugging Face ``datasets``) and ``tokens``, over
the shared ``_files`` (files of samples) and ``_tables`` (row blocks).
"""

from __future__ import annotations

from goodput.data.arrow import ArrowDataset
from goodput.data.cache import CacheConfig, RemoteCache
from goodput.data.folder import FolderDataset
from goodput.data.loader import FetchTimes, LoaderConfig, ResumableLoader
from goodput.data.mds import MDSDataset
from goodput.data.order import EpochOrder, rank_batch_count, rank_batch_range, sample_seed, sample_seeds
from goodput.data.parquet import ParquetDataset
from goodput.data.prefetch import DevicePrefetcher
from goodput.data.randomness import loader_seed, sample_np_rng, sample_rng
from goodput.data.sampler import BatchPlan, ResumableSampler
from goodput.data.shards import ShardedDataset, ShardWriter, write_folder_shards, write_shards
from goodput.data.tokens import TokenDataset
from goodput.data.webdataset import WebDataset

__all__ = [
    "ArrowDataset",
    "BatchPlan",
    "CacheConfig",
    "DevicePrefetcher",
    "EpochOrder",
    "FetchTimes",
    "FolderDataset",
    "LoaderConfig",
    "MDSDataset",
    "ParquetDataset",
    "RemoteCache",
    "ResumableLoader",
    "ResumableSampler",
    "ShardWriter",
    "ShardedDataset",
    "TokenDataset",
    "WebDataset",
    "loader_seed",
    "rank_batch_count",
    "rank_batch_range",
    "sample_np_rng",
    "sample_rng",
    "sample_seed",
    "sample_seeds",
    "write_folder_shards",
    "write_shards",
]
