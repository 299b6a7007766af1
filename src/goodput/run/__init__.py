"""The run and its launcher: ``Run`` wires checkpoints, data, ledger and faults into a user's loop;
``launch`` is the front over torchrun; ``crashloop``, ``watchdog`` and ``progress`` watch the job; ``signals``
turns a preemption signal into one agreed, durable save; ``verify``, ``records``, ``compare`` and
``verify_script`` check that a resumed run is the same run.

Names are imported on first use, so ``goodput launch`` does not import torch in the launcher process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from goodput.run.agent import WarmAgent, WarmConfig, launch_warm
    from goodput.run.compare import Difference, compare_records, drawn_generators, idle_generators
    from goodput.run.crashloop import CrashLoopDetector
    from goodput.run.launch import (
        EXIT_CRASH_LOOP,
        EXIT_FATAL,
        EXIT_PREEMPTED,
        LaunchConfig,
        launch_job,
        torchrun_command,
    )
    from goodput.run.progress import Progress
    from goodput.run.records import (
        RECORDS_ENV,
        RunRecords,
        StepRecord,
        StepRecorder,
        read_records,
        state_digests,
    )
    from goodput.run.run import Run
    from goodput.run.signals import PreemptionWatch
    from goodput.run.verify import effective_samples, first_difference, read_run
    from goodput.run.verify_script import kill_plan, run_captured, verify_resume
    from goodput.run.warm import WarmWorker, is_peer_failure, warm_enabled
    from goodput.run.watchdog import EXIT_HANG, Watchdog

_LAZY = {
    "CrashLoopDetector": "goodput.run.crashloop",
    "EXIT_CRASH_LOOP": "goodput.run.launch",
    "EXIT_FATAL": "goodput.run.launch",
    "EXIT_PREEMPTED": "goodput.run.launch",
    "LaunchConfig": "goodput.run.launch",
    "launch_job": "goodput.run.launch",
    "torchrun_command": "goodput.run.launch",
    "WarmAgent": "goodput.run.agent",
    "WarmConfig": "goodput.run.agent",
    "launch_warm": "goodput.run.agent",
    "WarmWorker": "goodput.run.warm",
    "is_peer_failure": "goodput.run.warm",
    "warm_enabled": "goodput.run.warm",
    "Progress": "goodput.run.progress",
    "Run": "goodput.run.run",
    "PreemptionWatch": "goodput.run.signals",
    "effective_samples": "goodput.run.verify",
    "first_difference": "goodput.run.verify",
    "read_run": "goodput.run.verify",
    "Difference": "goodput.run.compare",
    "compare_records": "goodput.run.compare",
    "drawn_generators": "goodput.run.compare",
    "idle_generators": "goodput.run.compare",
    "RECORDS_ENV": "goodput.run.records",
    "RunRecords": "goodput.run.records",
    "StepRecord": "goodput.run.records",
    "StepRecorder": "goodput.run.records",
    "read_records": "goodput.run.records",
    "state_digests": "goodput.run.records",
    "kill_plan": "goodput.run.verify_script",
    "run_captured": "goodput.run.verify_script",
    "verify_resume": "goodput.run.verify_script",
    "EXIT_HANG": "goodput.run.watchdog",
    "Watchdog": "goodput.run.watchdog",
}

__all__ = [
    "EXIT_CRASH_LOOP",
    "EXIT_FATAL",
    "EXIT_HANG",
    "EXIT_PREEMPTED",
    "RECORDS_ENV",
    "CrashLoopDetector",
    "Difference",
    "LaunchConfig",
    "PreemptionWatch",
    "Progress",
    "Run",
    "RunRecords",
    "StepRecord",
    "StepRecorder",
    "WarmAgent",
    "WarmConfig",
    "WarmWorker",
    "Watchdog",
    "compare_records",
    "drawn_generators",
    "effective_samples",
    "first_difference",
    "idle_generators",
    "is_peer_failure",
    "kill_plan",
    "launch_job",
    "launch_warm",
    "read_records",
    "read_run",
    "run_captured",
    "state_digests",
    "torchrun_command",
    "verify_resume",
    "warm_enabled",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'goodput.run' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
