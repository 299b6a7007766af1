"""goodput: keep PyTorch training productive when hardware fails.

The public API is re-exported here; ``tests/test_exports.py`` checks that every public module's ``__all__``
is reachable from this package.
"""

from __future__ import annotations

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

# Names whose modules import torch: resolved on first use (PEP 562) so `import goodput` and the CLI start fast.
_LAZY = {
    "goodput.checkpoint": (
        "MANIFEST_NAME STRATEGIES AutoInterval CheckpointConfig CheckpointInfo CheckpointLayout CheckpointManager"
        " EveryInterval EverySteps FileEntry LoaderState Manifest SaveContext SavePolicy SaveResult SaveStrategy"
        " TrainingState capture_rng check_shapes list_checkpoints make_strategy restore_rng tensor_shapes"
    ),
    "goodput.checkpoint.dcp": "DcpStrategy SafeLoadPlanner safe_unpickle_metadata",
    "goodput.checkpoint.dcp_async": "DcpAsyncStrategy",
    "goodput.checkpoint.torch_save": "TorchSaveStrategy",
}
_LAZY_NAMES = {name: module for module, names in _LAZY.items() for name in names.split()}


def __getattr__(name: str) -> object:
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'goodput' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "CheckpointCorrupt",
    "CheckpointError",
    "ConfigError",
    "CrashLoop",
    "DataError",
    "FingerprintMismatch",
    "GoodputError",
    "PlanInputs",
    "SaveFailed",
    "SimulationResult",
    "StateMismatch",
    "StorageError",
    "__version__",
    *sorted(_LAZY_NAMES),
    "daily_waste",
    "daly_expected_time",
    "daly_interval",
    "failure_probability",
    "format_duration",
    "goodput_daly",
    "goodput_first_order",
    "lost_work_per_failure",
    "mtbf_from_rate",
    "mtbf_seconds",
    "optimal_interval",
    "parse_bytes",
    "parse_duration",
    "simulate_goodput",
    "waste_per_failure",
    "young_interval",
]
