"""goodput: keep PyTorch training productive when hardware fails.

The public API is re-exported here; ``tests/test_exports.py`` checks that every public module's ``__all__``
is reachable from this package.
"""

from __future__ import annotations

from goodput.data.cache import CacheConfig, RemoteCache
from goodput.data.folder import FolderDataset
from goodput.data.shards import ShardedDataset, ShardWriter, write_folder_shards, write_shards
from goodput.errors import (
    CheckpointCorrupt,
    CheckpointError,
    ConfigError,
    CrashLoop,
    DataError,
    FingerprintMismatch,
    GoodputError,
    SaveFailed,
    StateMismatch,
    StorageError,
)
from goodput.units import format_duration, parse_bytes, parse_duration

__version__ = "0.1.0"

__all__ = [
    "CacheConfig",
    "CheckpointCorrupt",
    "CheckpointError",
    "ConfigError",
    "CrashLoop",
    "DataError",
    "FingerprintMismatch",
    "FolderDataset",
    "GoodputError",
    "RemoteCache",
    "SaveFailed",
    "ShardWriter",
    "ShardedDataset",
    "StateMismatch",
    "StorageError",
    "__version__",
    "format_duration",
    "parse_bytes",
    "parse_duration",
    "write_folder_shards",
    "write_shards",
]
