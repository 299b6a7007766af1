"""Running totals of one attempt for the progress line and the exporters (internal to :mod:`goodput.ledger.ledger`).

Live goodput is this attempt's step compute (fetch excluded) over its time since the process started; live
capacity goodput weighs each step's compute by the world size in force (the attempt's, then that of each
``shrink`` or ``grow``) over the ranks the job reserved, as the report's capacity goodput does for the run.
"""

from __future__ import annotations

import time
from typing import Any


class Live:
    """Running totals (guarded by the ledger's lock)."""

    def __init__(self, process_start: float, mono_now: float, *, world: int, reserved: int) -> None:
        self.process_start = process_start
        self.mono_origin = mono_now - max(0.0, time.time() - process_start)
        self.useful = 0.0
        self.useful_ranks = 0.0  # step compute x the world size in force (rank-seconds)
        self.world = world
        self.reserved = max(1, reserved)
        self.last_fetch: float | None = None
        self._step_start: float | None = None

    def observe(self, name: str, mono: float, fetch: Any) -> None:
        if name == "step_start":
            self._step_start = mono
        elif name == "step_end" and self._step_start is not None:
            self.last_fetch = float(fetch or 0.0)
            useful = max(0.0, mono - self._step_start - self.last_fetch)
            self.useful += useful
            self.useful_ranks += useful * self.world
            self._step_start = None

    def resized(self, world: int) -> None:
        """The group went on at ``world`` ranks (a shrink or a grow)."""
        self.world = world

    def goodput(self, mono_now: float) -> float:
        elapsed = mono_now - self.mono_origin
        return self.useful / elapsed if elapsed > 0 else 0.0

    def capacity_goodput(self, mono_now: float) -> float:
        elapsed = mono_now - self.mono_origin
        return self.useful_ranks / (self.reserved * elapsed) if elapsed > 0 else 0.0
