"""goodput: keep PyTorch training productive when hardware fails.

Every public name is re-exported here and imported on first use, so ``import goodput`` (and the command line)
stays fast while ``goodput.Run`` or ``goodput.CheckpointManager`` pull in torch only when touched.
``tests/test_exports.py`` checks that every public module's ``__all__`` is reachable from this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from goodput.accounting import (
        CATEGORIES,
        Accounting,
        AttemptSummary,
        SaveRecord,
        Segment,
        StepStats,
        account,
        goodput_over_time,
    )
    from goodput.data import (
        BatchPlan,
        CacheConfig,
        DevicePrefetcher,
        EpochOrder,
        FetchTimes,
        FolderDataset,
        LoaderConfig,
        RemoteCache,
        ResumableLoader,
        ResumableSampler,
        ShardedDataset,
        ShardWriter,
        rank_batch_count,
        rank_batch_range,
        sample_seed,
        sample_seeds,
        write_folder_shards,
        write_shards,
    )
    from goodput.exporters import (
        MetricsExporter,
        MLflowExporter,
        TensorBoardExporter,
        available_exporters,
    )
    from goodput.ledger import (
        Ledger,
        LedgerConfig,
        LedgerFile,
        ledger_files,
        read_events,
    )
    from goodput.planning import (
        PlanInputs,
        daily_waste,
        daly_expected_time,
        daly_interval,
        failure_probability,
        goodput_daly,
        goodput_first_order,
        lost_work_per_failure,
        mtbf_from_rate,
        mtbf_seconds,
        optimal_interval,
        waste_per_failure,
        young_interval,
    )
    from goodput.progress import (
        Progress,
    )
    from goodput.report import (
        Advice,
        MeasuredModel,
        Prediction,
        Report,
        build_report,
        load_report,
    )
    from goodput.simulation import (
        SimulationResult,
        simulate_goodput,
    )
    from goodput.units import (
        format_duration,
        parse_bytes,
        parse_duration,
    )

__version__ = "0.1.0"

_LAZY = {
    "Accounting": "goodput.accounting",
    "AttemptSummary": "goodput.accounting",
    "CATEGORIES": "goodput.accounting",
    "SaveRecord": "goodput.accounting",
    "Segment": "goodput.accounting",
    "StepStats": "goodput.accounting",
    "account": "goodput.accounting",
    "goodput_over_time": "goodput.accounting",
    "BatchPlan": "goodput.data",
    "CacheConfig": "goodput.data",
    "DevicePrefetcher": "goodput.data",
    "EpochOrder": "goodput.data",
    "FetchTimes": "goodput.data",
    "FolderDataset": "goodput.data",
    "LoaderConfig": "goodput.data",
    "RemoteCache": "goodput.data",
    "ResumableLoader": "goodput.data",
    "ResumableSampler": "goodput.data",
    "ShardWriter": "goodput.data",
    "ShardedDataset": "goodput.data",
    "rank_batch_count": "goodput.data",
    "rank_batch_range": "goodput.data",
    "sample_seed": "goodput.data",
    "sample_seeds": "goodput.data",
    "write_folder_shards": "goodput.data",
    "write_shards": "goodput.data",
    "MLflowExporter": "goodput.exporters",
    "MetricsExporter": "goodput.exporters",
    "TensorBoardExporter": "goodput.exporters",
    "available_exporters": "goodput.exporters",
    "Ledger": "goodput.ledger",
    "LedgerConfig": "goodput.ledger",
    "LedgerFile": "goodput.ledger",
    "ledger_files": "goodput.ledger",
    "read_events": "goodput.ledger",
    "PlanInputs": "goodput.planning",
    "daily_waste": "goodput.planning",
    "daly_expected_time": "goodput.planning",
    "daly_interval": "goodput.planning",
    "failure_probability": "goodput.planning",
    "goodput_daly": "goodput.planning",
    "goodput_first_order": "goodput.planning",
    "lost_work_per_failure": "goodput.planning",
    "mtbf_from_rate": "goodput.planning",
    "mtbf_seconds": "goodput.planning",
    "optimal_interval": "goodput.planning",
    "waste_per_failure": "goodput.planning",
    "young_interval": "goodput.planning",
    "Progress": "goodput.progress",
    "Advice": "goodput.report",
    "MeasuredModel": "goodput.report",
    "Prediction": "goodput.report",
    "Report": "goodput.report",
    "build_report": "goodput.report",
    "load_report": "goodput.report",
    "SimulationResult": "goodput.simulation",
    "simulate_goodput": "goodput.simulation",
    "format_duration": "goodput.units",
    "parse_bytes": "goodput.units",
    "parse_duration": "goodput.units",
}

__all__ = [
    "CATEGORIES",
    "Accounting",
    "Advice",
    "AttemptSummary",
    "BatchPlan",
    "CacheConfig",
    "CheckpointCorrupt",
    "CheckpointError",
    "ConfigError",
    "CrashLoop",
    "DataError",
    "DevicePrefetcher",
    "EpochOrder",
    "FetchTimes",
    "FingerprintMismatch",
    "FolderDataset",
    "GoodputError",
    "Ledger",
    "LedgerConfig",
    "LedgerFile",
    "LoaderConfig",
    "MLflowExporter",
    "MeasuredModel",
    "MetricsExporter",
    "PlanInputs",
    "Prediction",
    "Progress",
    "RemoteCache",
    "Report",
    "ResumableLoader",
    "ResumableSampler",
    "SaveFailed",
    "SaveRecord",
    "Segment",
    "ShardWriter",
    "ShardedDataset",
    "SimulationResult",
    "StateMismatch",
    "StepStats",
    "StorageError",
    "TensorBoardExporter",
    "__version__",
    "account",
    "available_exporters",
    "build_report",
    "daily_waste",
    "daly_expected_time",
    "daly_interval",
    "failure_probability",
    "format_duration",
    "goodput_daly",
    "goodput_first_order",
    "goodput_over_time",
    "ledger_files",
    "load_report",
    "lost_work_per_failure",
    "mtbf_from_rate",
    "mtbf_seconds",
    "optimal_interval",
    "parse_bytes",
    "parse_duration",
    "rank_batch_count",
    "rank_batch_range",
    "read_events",
    "sample_seed",
    "sample_seeds",
    "simulate_goodput",
    "waste_per_failure",
    "write_folder_shards",
    "write_shards",
    "young_interval",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'goodput' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
