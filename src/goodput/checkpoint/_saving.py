"""What a save returns (:class:`SaveResult`) and the small helpers the durable tier's save and restore paths
share: which errors count as a failed save, how to name one in a line, and DCP's single-process warning.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from torch.distributed.checkpoint import CheckpointException

from goodput.checkpoint.durable.strategy import Completion

__all__ = ["FAILURES", "SaveResult", "describe", "quiet_single_process", "raiser"]

# DCP reports a failure on any rank as CheckpointException, which derives from BaseException.
FAILURES = (Exception, CheckpointException)


def quiet_single_process() -> None:
    """Hide DCP's "torch.distributed is disabled ... assuming the intent is to save/load in a single process"
    warning, shown on every save and load of a process without a group: for goodput that is the intent.
    Installed before each save and load (not once at import) so that a caller's ``catch_warnings`` cannot
    drop it; installing an identical filter again replaces it, so the filter list does not grow."""
    warnings.filterwarnings(
        "ignore", message="torch.distributed is disabled, unavailable or uninitialized", category=UserWarning
    )


@dataclass(frozen=True)
class SaveResult:
    """What one save cost.

    Attributes:
        step: the step saved.
        strategy: the strategy that wrote it.
        stall_seconds: how long ``save`` blocked training.
        persist_seconds: from the start of ``save`` until the checkpoint was committed (None while in flight).
        url: the committed folder (None while in flight).
        bytes: total size of the committed files (None while in flight).
        skipped: True when the step was already committed and nothing was written.
    """

    step: int
    strategy: str
    stall_seconds: float
    persist_seconds: float | None = None
    url: str | None = None
    bytes: int | None = None
    skipped: bool = False


def raiser(err: BaseException) -> Completion:
    """A completion that raises ``err`` (a save that failed before its write began)."""

    def complete() -> list[str]:
        raise err

    return complete


def describe(err: BaseException) -> str:
    """One line for an error; DCP's CheckpointException carries each rank's real error inside."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        return "; ".join(f"{type(e).__name__}: {e}" for e in inner)
    return f"{type(err).__name__}: {err}"
