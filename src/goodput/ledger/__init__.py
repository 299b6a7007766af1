"""The ledger and its report: where every second of a run went.

``ledger`` writes one append-only JSONL file per attempt and rank; ``accounting`` (with ``spans``) turns the
events of every rank into categories that tile wall time; ``report`` compares them with the planner and
gives advice (``advice``), as text (``text``), a timeline (``plot``) or live metrics (``exporters``).
The ledger learns of checkpoints and restarts only through events: nothing here imports ``run`` or
``checkpoint``.
"""

from goodput.ledger.accounting import (
    CATEGORIES,
    Accounting,
    AttemptSummary,
    SaveRecord,
    Segment,
    StepStats,
    account,
    goodput_over_time,
)
from goodput.ledger.exporters import MetricsExporter, MLflowExporter, TensorBoardExporter, available_exporters
from goodput.ledger.ledger import Ledger, LedgerConfig, LedgerFile, ledger_files, read_events
from goodput.ledger.report import Advice, MeasuredModel, Prediction, Report, build_report, load_report
from goodput.ledger.tiers import live_recovered_share, restores_by_tier

__all__ = [
    "CATEGORIES",
    "Accounting",
    "Advice",
    "AttemptSummary",
    "Ledger",
    "LedgerConfig",
    "LedgerFile",
    "MLflowExporter",
    "MeasuredModel",
    "MetricsExporter",
    "Prediction",
    "Report",
    "SaveRecord",
    "Segment",
    "StepStats",
    "TensorBoardExporter",
    "account",
    "available_exporters",
    "build_report",
    "goodput_over_time",
    "ledger_files",
    "live_recovered_share",
    "load_report",
    "read_events",
    "restores_by_tier",
]
