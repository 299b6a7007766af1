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
from goodput.progress import Progress
from goodput.report import Advice, MeasuredModel, Prediction, Report, build_report, load_report
from goodput.simulation import SimulationResult, simulate_goodput
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
    "PlanInputs",
    "Prediction",
    "Progress",
    "Report",
    "SaveFailed",
    "SaveRecord",
    "Segment",
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
    "read_events",
    "simulate_goodput",
    "waste_per_failure",
    "young_interval",
]
