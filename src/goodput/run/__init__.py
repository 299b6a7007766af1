"""The worker side of a run: ``Run`` and what watches it inside the user's process (signals, watchdog,
progress, the numeric guard).

The launcher lives in ``goodput.launch``, warm restarts in ``goodput.warm``, what the launcher and the workers
agree on (exit codes, the launch folder, crash-loop records) in ``goodput.job``, verify-resume in
``goodput.verify``. ``Run`` is imported on first use, so importing this package does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from goodput.run.run import Run

__all__ = ["Run"]


def __getattr__(name: str) -> Any:
    if name != "Run":
        raise AttributeError(f"module 'goodput.run' has no attribute {name!r}")
    from goodput.run.run import Run

    globals()["Run"] = Run
    return Run
