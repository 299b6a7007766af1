"""The public API of ``goodput``, declared once: each name the user writes as ``gp.X``, and the module that
defines it.

``goodput/__init__.py`` derives ``__all__``, ``__dir__`` and its lazy imports from :data:`PUBLIC` (so
``import goodput`` stays fast and torch is imported only when ``gp.Run`` is touched), and
``goodput/__init__.pyi`` gives type checkers the same names (``tests/test_exports.py`` keeps it equal to this
table and freezes the list: adding a public name is a visible decision). Everything else stays importable from
its own module only.
"""

from __future__ import annotations

__all__ = ["ON_TOUCH", "PUBLIC"]

PUBLIC: dict[str, str] = {
    # a run
    "Run": "goodput.run",
    "RunHook": "goodput.run.hooks",
    "NumericConfig": "goodput.run.numeric",
    "StragglerConfig": "goodput.run.stragglers",
    # checkpoints
    "CheckpointConfig": "goodput.checkpoint",
    "CheckpointManager": "goodput.checkpoint",
    "MemoryTier": "goodput.checkpoint",
    "TrainingState": "goodput.checkpoint",
    "list_checkpoints": "goodput.checkpoint",
    "rank_seed": "goodput.checkpoint",
    # data
    "ResumableLoader": "goodput.data",
    "DevicePrefetcher": "goodput.data",
    "CacheConfig": "goodput.data",
    "ShardedDataset": "goodput.data",
    "FolderDataset": "goodput.data",
    "TokenDataset": "goodput.data",
    "WebDataset": "goodput.data",
    "MDSDataset": "goodput.data",
    "ParquetDataset": "goodput.data",
    "ArrowDataset": "goodput.data",
    "sample_rng": "goodput.data",
    "sample_np_rng": "goodput.data",
    "sample_seed": "goodput.data",
    # the ledger and the report
    "Ledger": "goodput.ledger",
    "LedgerConfig": "goodput.ledger",
    "read_events": "goodput.ledger",
    "account": "goodput.ledger.accounting",
    "Report": "goodput.ledger.report",
    "build_report": "goodput.ledger.report",
    "load_report": "goodput.ledger.report",
    # the planner
    "PlanInputs": "goodput.planning",
    "Costs": "goodput.planning",
    "optimal_interval": "goodput.planning",
    "young_interval": "goodput.planning",
    "goodput_daly": "goodput.planning",
    "simulate_goodput": "goodput.planning.simulation",
    # fault drills
    "Fault": "goodput.faults",
    "FaultPlan": "goodput.faults",
    "parse_faults": "goodput.faults",
    # exporters
    "MetricsExporter": "goodput.ledger.exporters",
    "MLflowExporter": "goodput.ledger.exporters",
    "TensorBoardExporter": "goodput.ledger.exporters",
    "available_exporters": "goodput.ledger.exporters",
    # processes
    "init_distributed": "goodput.distributed",
    # errors (the tree is drawn in goodput.errors)
    "GoodputError": "goodput.errors",
    "ConfigError": "goodput.errors",
    "DataError": "goodput.errors",
    "StorageError": "goodput.errors",
    "AccessRefused": "goodput.errors",
    "CheckpointError": "goodput.errors",
    "CheckpointCorrupt": "goodput.errors",
    "NoValidCheckpoint": "goodput.errors",
    "SaveFailed": "goodput.errors",
    "StateMismatch": "goodput.errors",
    "FingerprintMismatch": "goodput.errors",
    "CrashLoop": "goodput.errors",
    "NumericFault": "goodput.errors",
    "StragglerStop": "goodput.errors",
    # units
    "parse_bytes": "goodput.units",
    "parse_duration": "goodput.units",
    "format_duration": "goodput.units",
}

# The integrations: reachable as ``gp.X`` and imported (with their framework) only when touched, but kept out of
# ``__all__`` so that ``from goodput import *`` never needs Lightning, transformers or prometheus-client.
ON_TOUCH: dict[str, str] = {
    "GoodputCallback": "goodput.integrations.lightning",
    "GoodputCheckpointIO": "goodput.integrations.lightning",
    "GoodputDDPStrategy": "goodput.integrations.lightning",
    "GoodputTrainer": "goodput.integrations.hf",
    "GoodputTrainerCallback": "goodput.integrations.hf",
    "PrometheusExporter": "goodput.integrations.prometheus",
}
