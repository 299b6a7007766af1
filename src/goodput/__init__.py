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
    from goodput.checkpoint import (
        MANIFEST_NAME,
        STRATEGIES,
        AutoInterval,
        CheckpointConfig,
        CheckpointInfo,
        CheckpointLayout,
        CheckpointManager,
        EveryInterval,
        EverySteps,
        FileEntry,
        LoaderState,
        Manifest,
        SaveContext,
        SavePolicy,
        SaveResult,
        SaveStrategy,
        TrainingState,
        capture_rng,
        check_shapes,
        list_checkpoints,
        make_strategy,
        restore_rng,
        tensor_shapes,
    )
    from goodput.checkpoint.dcp import (
        DcpStrategy,
        SafeLoadPlanner,
        safe_unpickle_metadata,
    )
    from goodput.checkpoint.dcp_async import (
        DcpAsyncStrategy,
    )
    from goodput.checkpoint.torch_save import (
        TorchSaveStrategy,
    )
    from goodput.crashloop import (
        CrashLoopDetector,
    )
    from goodput.distributed import (
        DistInfo,
        dist_info,
        init_distributed,
    )
    from goodput.exporters import (
        MetricsExporter,
        MLflowExporter,
        TensorBoardExporter,
        available_exporters,
    )
    from goodput.faults import (
        PHASES,
        Fault,
        FaultPlan,
        InjectedFault,
        fault_point,
        install_faults,
        parse_faults,
    )
    from goodput.launch import (
        EXIT_CRASH_LOOP,
        LaunchConfig,
        launch,
        torchrun_command,
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
    from goodput.run import (
        Run,
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
    from goodput.verify import (
        effective_samples,
        first_difference,
        read_run,
    )
    from goodput.verify_runs import (
        fault_plan,
        prepare_data,
        train,
    )
    from goodput.watchdog import (
        EXIT_HANG,
        Watchdog,
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
    "AutoInterval": "goodput.checkpoint",
    "CheckpointConfig": "goodput.checkpoint",
    "CheckpointInfo": "goodput.checkpoint",
    "CheckpointLayout": "goodput.checkpoint",
    "CheckpointManager": "goodput.checkpoint",
    "EveryInterval": "goodput.checkpoint",
    "EverySteps": "goodput.checkpoint",
    "FileEntry": "goodput.checkpoint",
    "LoaderState": "goodput.checkpoint",
    "MANIFEST_NAME": "goodput.checkpoint",
    "Manifest": "goodput.checkpoint",
    "STRATEGIES": "goodput.checkpoint",
    "SaveContext": "goodput.checkpoint",
    "SavePolicy": "goodput.checkpoint",
    "SaveResult": "goodput.checkpoint",
    "SaveStrategy": "goodput.checkpoint",
    "TrainingState": "goodput.checkpoint",
    "capture_rng": "goodput.checkpoint",
    "check_shapes": "goodput.checkpoint",
    "list_checkpoints": "goodput.checkpoint",
    "make_strategy": "goodput.checkpoint",
    "restore_rng": "goodput.checkpoint",
    "tensor_shapes": "goodput.checkpoint",
    "DcpStrategy": "goodput.checkpoint.dcp",
    "SafeLoadPlanner": "goodput.checkpoint.dcp",
    "safe_unpickle_metadata": "goodput.checkpoint.dcp",
    "DcpAsyncStrategy": "goodput.checkpoint.dcp_async",
    "TorchSaveStrategy": "goodput.checkpoint.torch_save",
    "CrashLoopDetector": "goodput.crashloop",
    "DistInfo": "goodput.distributed",
    "dist_info": "goodput.distributed",
    "init_distributed": "goodput.distributed",
    "MLflowExporter": "goodput.exporters",
    "MetricsExporter": "goodput.exporters",
    "TensorBoardExporter": "goodput.exporters",
    "available_exporters": "goodput.exporters",
    "Fault": "goodput.faults",
    "FaultPlan": "goodput.faults",
    "InjectedFault": "goodput.faults",
    "PHASES": "goodput.faults",
    "fault_point": "goodput.faults",
    "install_faults": "goodput.faults",
    "parse_faults": "goodput.faults",
    "EXIT_CRASH_LOOP": "goodput.launch",
    "LaunchConfig": "goodput.launch",
    "launch": "goodput.launch",
    "torchrun_command": "goodput.launch",
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
    "Run": "goodput.run",
    "SimulationResult": "goodput.simulation",
    "simulate_goodput": "goodput.simulation",
    "format_duration": "goodput.units",
    "parse_bytes": "goodput.units",
    "parse_duration": "goodput.units",
    "effective_samples": "goodput.verify",
    "first_difference": "goodput.verify",
    "read_run": "goodput.verify",
    "fault_plan": "goodput.verify_runs",
    "prepare_data": "goodput.verify_runs",
    "train": "goodput.verify_runs",
    "EXIT_HANG": "goodput.watchdog",
    "Watchdog": "goodput.watchdog",
}

__all__ = [
    "CATEGORIES",
    "EXIT_CRASH_LOOP",
    "EXIT_HANG",
    "MANIFEST_NAME",
    "PHASES",
    "STRATEGIES",
    "Accounting",
    "Advice",
    "AttemptSummary",
    "AutoInterval",
    "CheckpointConfig",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointLayout",
    "CheckpointManager",
    "ConfigError",
    "CrashLoop",
    "CrashLoopDetector",
    "DataError",
    "DcpAsyncStrategy",
    "DcpStrategy",
    "DistInfo",
    "EveryInterval",
    "EverySteps",
    "Fault",
    "FaultPlan",
    "FileEntry",
    "FingerprintMismatch",
    "GoodputError",
    "InjectedFault",
    "LaunchConfig",
    "Ledger",
    "LedgerConfig",
    "LedgerFile",
    "LoaderState",
    "MLflowExporter",
    "Manifest",
    "MeasuredModel",
    "MetricsExporter",
    "PlanInputs",
    "Prediction",
    "Progress",
    "Report",
    "Run",
    "SafeLoadPlanner",
    "SaveContext",
    "SaveFailed",
    "SavePolicy",
    "SaveRecord",
    "SaveResult",
    "SaveStrategy",
    "Segment",
    "SimulationResult",
    "StateMismatch",
    "StepStats",
    "StorageError",
    "TensorBoardExporter",
    "TorchSaveStrategy",
    "TrainingState",
    "Watchdog",
    "__version__",
    "account",
    "available_exporters",
    "build_report",
    "capture_rng",
    "check_shapes",
    "daily_waste",
    "daly_expected_time",
    "daly_interval",
    "dist_info",
    "effective_samples",
    "failure_probability",
    "fault_plan",
    "fault_point",
    "first_difference",
    "format_duration",
    "goodput_daly",
    "goodput_first_order",
    "goodput_over_time",
    "init_distributed",
    "install_faults",
    "launch",
    "ledger_files",
    "list_checkpoints",
    "load_report",
    "lost_work_per_failure",
    "make_strategy",
    "mtbf_from_rate",
    "mtbf_seconds",
    "optimal_interval",
    "parse_bytes",
    "parse_duration",
    "parse_faults",
    "prepare_data",
    "read_events",
    "read_run",
    "restore_rng",
    "safe_unpickle_metadata",
    "simulate_goodput",
    "tensor_shapes",
    "torchrun_command",
    "train",
    "waste_per_failure",
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
