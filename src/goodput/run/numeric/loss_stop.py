"""The default for a non-finite loss when the numeric guard is off: stop the run, never train on silently.

Without the guard (``Run(numeric=False)``, the default) a NaN or Inf loss given to ``run.step_done(loss=...)``
stops the run on the rank that sees it, in that ``step_done``, before the step can be saved: one line names the
step, the rank and the value and says how to turn the guard on, and the job ends with ``EXIT_NUMERIC`` (65),
which ``goodput launch`` does not restart (the same data would bring the same NaN back).

The check reads only the float the user passes, on this rank: no collective, so it costs nothing per step. With
DDP a loss is often this rank's own (``loss.item()`` before any all-reduce), so the other ranks may not see it:
this rank reports the stop to the launcher at once (``NUMERIC`` in the launch folder, which ends every rank of
the job) and lets go of the run without saving, and no checkpoint of that step or later can be committed
without this rank's part. Without a loss (``step_done()``) there is nothing to check.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from goodput.errors import NumericFault
from goodput.job.folder import report_failure
from goodput.run.hooks import RunHook
from goodput.run.numeric.ops import json_number

if TYPE_CHECKING:
    from goodput.run.run import Run

__all__ = ["LossStop"]


class LossStop(RunHook):
    """Stop the run at a non-finite loss (the default while the numeric guard is off; see the module)."""

    def on_step(self, run: Run, step: int, loss: float | None) -> bool:
        if loss is None or math.isfinite(loss):
            return False
        from goodput.job.codes import EXIT_NUMERIC

        rank = run.info.rank
        line = (
            f"step {step}: the loss is {loss} on rank {rank}; stopping before any checkpoint holds it "
            f"(exit {EXIT_NUMERIC}). Turn the numeric guard on to roll back and skip the bad data instead: "
            "gp.Run(..., numeric=True) or numeric=gp.NumericConfig(...) (docs/numeric-faults.md)"
        )
        run.ledger.event(
            "numeric_fault", kind="nonfinite", step=step, on_rank=rank, value=json_number(loss),
            detail="the loss", detected_at=step,
        )  # fmt: skip
        run.ledger.event("numeric_stop", reason="a non-finite loss with the numeric guard off", line=line)
        run.ledger.flush()  # on disk before the report: the launcher may end this process at once after it
        stop = NumericFault(line)
        report_failure(rank, stop)  # the launcher ends every rank now, whatever this process does next
        run.abandon()
        raise stop
