"""goodput: keep PyTorch training productive when hardware fails.

The public API is re-exported here; ``tests/test_exports.py`` checks that every public module's ``__all__``
is reachable from this package.
"""

from __future__ import annotations

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
from goodput.exporters import MetricsExporter, MLflowExporter, TensorBoardExporter, available_exporters
from goodput.ledger import Ledger, LedgerConfig, LedgerFile, ledger_files, read_events
from goodput.progress import Progress
from goodput.report import Advice, MeasuredModel, Prediction, Report, build_report, load_report
from goodput.units import format_duration, parse_bytes, parse_duration

__version__ = "0.1.0"

__all__ = [
    "CATEGORIES",
    "Accounting",
    "Advice",
    "AttemptSummary",
    "CheckpointCorrupt",
    "CheckpointError",
    "ConfigError",
    "CrashLoop",
    "DataError",
    "FingerprintMismatch",
    "GoodputError",
    "Ledger",
    "LedgerConfig",
    "LedgerFile",
    "MLflowExporter",
    "MeasuredModel",
    "MetricsExporter",
    "Prediction",
    "Progress",
    "Report",
    "SaveFailed",
    "SaveRecord",
    "Segment",
    "StateMismatch",
    "StepStats",
    "StorageError",
    "TensorBoardExporter",
    "__version__",
    "account",
    "available_exporters",
    "build_report",
    "format_duration",
    "goodput_over_time",
    "ledger_files",
    "load_report",
    "parse_bytes",
    "parse_duration",
    "read_events",
]
