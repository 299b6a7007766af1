"""The fault plan of a framework-driven run: the same plan, markers and ledger record as ``goodput.Run``'s."""

from __future__ import annotations

import os

from goodput.faults import Fault, FaultPlan, install_faults, parse_faults
from goodput.ledger.ledger import Ledger

__all__ = ["install_plan"]


def install_plan(run_dir: str, ledger: Ledger, *, rank: int, world_size: int, step: list[int]) -> FaultPlan:
    """Build the plan in ``$GOODPUT_FAULTS`` for this rank and attempt, and make ``fault_point`` see it.

    ``step`` is a one-item list holding the current step, read when a fault fires (for the ledger record).
    """

    def fired(fault: Fault, where: str) -> None:
        ledger.event("fault_injected", action=fault.action, where=where, step=step[0])
        if fault.action in ("kill", "hang"):
            ledger.flush()  # the process is about to die or stop: keep the record

    plan = FaultPlan(
        parse_faults(os.environ.get("GOODPUT_FAULTS", "")),
        rank=rank,
        world_size=world_size,
        attempt=ledger.attempt,
        marker_dir=os.path.join(run_dir, "faults"),
        on_fire=fired,
    )
    install_faults(plan)
    return plan
