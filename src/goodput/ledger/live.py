"""Running totals of one attempt for the progress line and the exporters (internal to :mod:`goodput.ledger.ledger`).

Live goodput is this process's step compute (fetch excluded) over its time since the process started; an
attempt that goes on in the same process (a warm restart's survivor, a rollback) carries the totals of the one
before, and a hot spare that takes a failed rank's place goes on from those of the rank that sent it the
training state (both: :meth:`Live.carry`), so neither figure is that of a window a few steps long. Live
capacity goodput weighs each step's compute by the world size in force (the attempt's, then that of each
``shrink`` or ``grow``) over the ranks the job reserved, as the report's capacity goodput does for the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from goodput._env import RESERVED_WORLD
from goodput.errors import ConfigError


def process_start_wall() -> float | None:
    """Wall time at which this process started (Linux /proc), to count interpreter and import time."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        start_ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22: starttime, in clock ticks
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - max(0.0, age)


def reserved_world(world: int) -> int:
    """The ranks the job reserved: ``$GOODPUT_RESERVED_WORLD`` (set by goodput launch), else ``world``.

    Raises:
        ConfigError: when the variable is set but is not a whole number >= 1.
    """
    text = RESERVED_WORLD.get().strip()
    if not text:
        return world
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{RESERVED_WORLD.name}={text!r} must be a whole number of ranks >= 1")
    return value


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

    def totals(self, mono_now: float) -> dict[str, float]:
        """What another process goes on from: the origin as a wall time, and the step compute."""
        origin = time.time() - (mono_now - self.mono_origin)
        return {"origin_wall": origin, "useful": self.useful, "useful_ranks": self.useful_ranks}

    def carry(self, totals: Mapping[str, float], mono_now: float) -> None:
        """Go on from :meth:`totals` of an earlier attempt: its origin, and its step compute added."""
        self.mono_origin = mono_now - max(0.0, time.time() - float(totals["origin_wall"]))
        self.useful += float(totals["useful"])
        self.useful_ranks += float(totals["useful_ranks"])

    def resized(self, world: int) -> None:
        """The group went on at ``world`` ranks (a shrink or a grow)."""
        self.world = world

    def goodput(self, mono_now: float) -> float:
        elapsed = mono_now - self.mono_origin
        return self.useful / elapsed if elapsed > 0 else 0.0

    def capacity_goodput(self, mono_now: float) -> float:
        elapsed = mono_now - self.mono_origin
        return self.useful_ranks / (self.reserved * elapsed) if elapsed > 0 else 0.0
