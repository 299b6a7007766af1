"""goodput: keep PyTorch training productive when hardware fails.

The public API is re-exported here; ``tests/test_exports.py`` checks that every public module's ``__all__``
is reachable from this package.
"""

from __future__ import annotations

from goodput.data import (
    BatchPlan,
    DevicePrefetcher,
    EpochOrder,
    FetchTimes,
    LoaderConfig,
    ResumableLoader,
    ResumableSampler,
    rank_batch_count,
    rank_batch_range,
    sample_seed,
    sample_seeds,
)
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
    "BatchPlan",
    "CheckpointCorrupt",
    "CheckpointError",
    "ConfigError",
    "CrashLoop",
    "DataError",
    "DevicePrefetcher",
    "EpochOrder",
    "FetchTimes",
    "FingerprintMismatch",
    "GoodputError",
    "LoaderConfig",
    "ResumableLoader",
    "ResumableSampler",
    "SaveFailed",
    "StateMismatch",
    "StorageError",
    "__version__",
    "format_duration",
    "parse_bytes",
    "parse_duration",
    "rank_batch_count",
    "rank_batch_range",
    "sample_seed",
    "sample_seeds",
]
