"""The resumable, overlapped data pipeline: exactly-once samples across crashes, workers and world sizes.

``order`` (pure: the sample order and its split over ranks), ``sampler`` (the data position), ``loader``
(ResumableLoader over torch's DataLoader, fetch_seconds), ``prefetch`` (DevicePrefetcher) and ``randomness``
(per-sample generators, the loader's own generator); ``cache`` (remote
storage through a local cache), ``shards`` (the sharded format, its writer and reader), ``folder`` (one sample
per file) and the formats read in place: ``parquet``, ``arrow`` (Hugging Face ``datasets``) and ``tokens``, over
the shared ``_files`` (files of samples) and ``_tables`` (row blocks).

The names are imported on first use (as ``goodput``'s own are), so a process that only reads through the cache
or the sharded format (a cache reader, a spawned helper) does not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from goodput._lazy import lazy_names

if TYPE_CHECKING:
    from goodput.data.arrow import ArrowDataset
    from goodput.data.cache import CacheConfig, RemoteCache
    from goodput.data.fetch_times import FetchTimes
    from goodput.data.folder import FolderDataset
    from goodput.data.loader import LoaderConfig, ResumableLoader
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

_MODULES = {
    "ArrowDataset": "goodput.data.arrow",
    "BatchPlan": "goodput.data.sampler",
    "CacheConfig": "goodput.data.cache",
    "DevicePrefetcher": "goodput.data.prefetch",
    "EpochOrder": "goodput.data.order",
    "FetchTimes": "goodput.data.fetch_times",
    "FolderDataset": "goodput.data.folder",
    "LoaderConfig": "goodput.data.loader",
    "MDSDataset": "goodput.data.mds",
    "ParquetDataset": "goodput.data.parquet",
    "RemoteCache": "goodput.data.cache",
    "ResumableLoader": "goodput.data.loader",
    "ResumableSampler": "goodput.data.sampler",
    "ShardWriter": "goodput.data.shards",
    "ShardedDataset": "goodput.data.shards",
    "TokenDataset": "goodput.data.tokens",
    "WebDataset": "goodput.data.webdataset",
    "loader_seed": "goodput.data.randomness",
    "rank_batch_count": "goodput.data.order",
    "rank_batch_range": "goodput.data.order",
    "sample_np_rng": "goodput.data.randomness",
    "sample_rng": "goodput.data.randomness",
    "sample_seed": "goodput.data.order",
    "sample_seeds": "goodput.data.order",
    "write_folder_shards": "goodput.data.shards",
    "write_shards": "goodput.data.shards",
}


__getattr__, __dir__ = lazy_names(__name__, _MODULES, globals(), __all__)
