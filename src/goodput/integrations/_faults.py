"""What the framework callbacks share with ``goodput.Run``: the fault plan (same plan, markers and ledger
record) and feeding metric exporters."""

from __future__ import annotations

import os
from collections.abc import Sequence

from goodput._env import FAULTS
from goodput.faults import Fault, FaultPlan, install_faults, parse_faults
from goodput.ledger.exporters import MetricsExporter
from goodput.ledger.ledger import Ledger

__all__ = ["export", "install_plan"]


def install_plan(run_dir: str, ledger: Ledger, *, rank: int, world_size: int, step: list[int]) -> FaultPlan:
    """Build the plan in ``$GOODPUT_FAULTS`` for this rank and attempt, and make ``fault_point`` see it.

    ``step`` is a one-item list holding the current step, read when a fault fires (for the ledger record).
    """

    def fired(fault: Fault, where: str) -> None:
        ledger.event("fault_injected", action=fault.action, where=where, step=step[0])
        if fault.action in ("kill", "hang"):
            ledger.flush()  # the process is about to die or stop: keep the record

    plan = FaultPlan(
        parse_faults(FAULTS.get()),
        rank=rank,
        world_size=world_size,
        attempt=ledger.attempt,
        marker_dir=os.path.join(run_dir, "faults"),
        on_fire=fired,
    )
    install_faults(plan)
    return plan


def export(
    exporters: Sequence[MetricsExporter], step: int, ledger: Ledger, fetch: float, loss: float | None
) -> None:
    """Give every exporter the step's live goodput, fetch time and loss (what ``Progress`` gives them)."""
    metrics = {"goodput": ledger.live_goodput, "fetch_seconds": fetch}
    if loss is not None:
        metrics["loss"] = loss
    for exporter in exporters:
        exporter.log(step, metrics)
