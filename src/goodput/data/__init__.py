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
    from goodput.data.cache import CacheConfig
    from goodput.data.folder import FolderDataset
    from goodput.data.loader import ResumableLoader
    from goodput.data.mds import MDSDataset
    from goodput.data.order import sample_seed
    from goodput.data.parquet import ParquetDataset
    from goodput.data.prefetch import DevicePrefetcher
    from goodput.data.randomness import sample_np_rng, sample_rng
    from goodput.data.shards import ShardedDataset, write_shards
    from goodput.data.tokens import TokenDataset
    from goodput.data.webdataset import WebDataset

__all__ = [
    "ArrowDataset",
    "CacheConfig",
    "DevicePrefetcher",
    "FolderDataset",
    "MDSDataset",
    "ParquetDataset",
    "ResumableLoader",
    "ShardedDataset",
    "TokenDataset",
    "WebDataset",
    "sample_np_rng",
    "sample_rng",
    "sample_seed",
    "write_shards",
]

_MODULES = {
    "ArrowDataset": "goodput.data.arrow",
    "CacheConfig": "goodput.data.cache",
    "DevicePrefetcher": "goodput.data.prefetch",
    "FolderDataset": "goodput.data.folder",
    "MDSDataset": "goodput.data.mds",
    "ParquetDataset": "goodput.data.parquet",
    "ResumableLoader": "goodput.data.loader",
    "ShardedDataset": "goodput.data.shards",
    "TokenDataset": "goodput.data.tokens",
    "WebDataset": "goodput.data.webdataset",
    "sample_np_rng": "goodput.data.randomness",
    "sample_rng": "goodput.data.randomness",
    "sample_seed": "goodput.data.order",
    "write_shards": "goodput.data.shards",
}


__getattr__, __dir__ = lazy_names(__name__, _MODULES, globals(), __all__)
