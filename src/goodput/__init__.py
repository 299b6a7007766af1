"""goodput: keep PyTorch training productive when hardware fails.

The public API is re-exported here; ``tests/test_exports.py`` checks that every public module's ``__all__``
is reachable from this package.
"""

from __future__ import annotations

from goodput.distributed import DistInfo, dist_info, init_distributed
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
from goodput.faults import PHASES, Fault, FaultPlan, InjectedFault, parse_faults
from goodput.launch import EXIT_CRASH_LOOP, LaunchConfig, launch, torchrun_command
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
from goodput.simulation import SimulationResult, simulate_goodput
from goodput.units import format_duration, parse_bytes, parse_duration
from goodput.watchdog import EXIT_HANG, Watchdog

__version__ = "0.1.0"

__all__ = [
    "EXIT_CRASH_LOOP",
    "EXIT_HANG",
    "PHASES",
    "CheckpointCorrupt",
    "CheckpointError",
    "ConfigError",
    "CrashLoop",
    "DataError",
    "DistInfo",
    "Fault",
    "FaultPlan",
    "FingerprintMismatch",
    "GoodputError",
    "InjectedFault",
    "LaunchConfig",
    "PlanInputs",
    "SaveFailed",
    "SimulationResult",
    "StateMismatch",
    "StorageError",
    "Watchdog",
    "__version__",
    "daily_waste",
    "daly_expected_time",
    "daly_interval",
    "dist_info",
    "failure_probability",
    "format_duration",
    "goodput_daly",
    "goodput_first_order",
    "init_distributed",
    "launch",
    "lost_work_per_failure",
    "mtbf_from_rate",
    "mtbf_seconds",
    "optimal_interval",
    "parse_bytes",
    "parse_duration",
    "parse_faults",
    "simulate_goodput",
    "torchrun_command",
    "waste_per_failure",
    "young_interval",
]
