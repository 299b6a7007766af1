"""Straggler scores and alarms: pure functions over per-rank window figures (no clocks, no torch.distributed).

Every ``StragglerConfig.every`` steps each rank contributes one :class:`RankWindow`: the medians over those steps
of its own compute (the step minus its batch wait and minus its wait for the others), its batch wait, and its
wait for the others, and the lowest compute of any of its steps in the window. From the windows of every rank
:class:`StragglerRules` derives, identically on every rank:

- the *relative score* of each rank: the fastest rank's speed over this rank's (1.0: as fast as the fastest;
  0.67: its own work takes 1.5x as long), speed being the window's lowest compute plus its median batch wait.
  The lowest compute, not the median: noise on a shared machine (a descheduled thread, a wait the hooks do not
  see) only ever adds time, while a slow GPU makes every step slow. Batch waits keep the median: a loader with
  workers hands some batches at once and makes the loop wait for others, so a slow dataset's lowest wait is 0;
- the *individual score*: the rank's best speed over its current one (it slowed down against itself);
- the window's *straggler wait*: how much longer the job's steps took than a balanced step would have, where
  balanced is the median of the other ranks' own time (the slowest rank's excess, once per step);
- an alarm when one rank's relative score stays under ``threshold`` for ``windows`` windows in a row, with
  whether its excess is in compute or in data.

Medians over a window make one descheduled step (a shared machine, a collector pause) move nothing; the run of
``windows`` windows makes one slow window move nothing either.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

__all__ = ["RankWindow", "StragglerConfig", "StragglerRules", "WindowVerdict"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StragglerConfig:
    """The straggler detector: how often ranks compare their times, and when a slow rank raises an alarm.

    Args:
        every: steps per window; the ranks exchange their figures once a window (one small all-gather).
        threshold: a rank whose relative score (fastest own time / its own time) is under this is slow.
        windows: slow windows in a row that raise the alarm.
        min_excess: seconds of own time over the fastest rank's (per step) under which a rank is never slow:
            noise on very short steps.
        stop: on the alarm, stop the job (exit ``EXIT_STRAGGLER``, not requeued: reschedule it elsewhere).
        replace: under ``goodput launch --restart warm``, on the alarm the slow rank exits and a hot spare
            takes its place; without warm restarts this is a ConfigError.
    """

    every: int = 5
    threshold: float = 0.75
    windows: int = 2
    min_excess: float = 0.002
    stop: bool = False
    replace: bool = False

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"StragglerConfig.every must be >= 1 step, got {self.every}")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"StragglerConfig.threshold must be in (0, 1), got {self.threshold}")
        if self.windows < 1:
            raise ValueError(f"StragglerConfig.windows must be >= 1, got {self.windows}")
        if not math.isfinite(self.min_excess) or self.min_excess < 0:
            raise ValueError(f"StragglerConfig.min_excess must be >= 0 seconds, got {self.min_excess}")
        if self.stop and self.replace:
            raise ValueError("StragglerConfig: stop=True and replace=True exclude each other; choose one")


@dataclasses.dataclass(frozen=True)
class RankWindow:
    """One rank's medians over one window (seconds per step) and the window's step count."""

    compute: float
    data: float
    wait: float
    steps: int
    floor: float | None = None  # the lowest compute of one step in the window (None: use the median)

    @property
    def own(self) -> float:
        """The rank's own time per step: what it would take if no rank waited for another."""
        return self.compute + self.data

    @property
    def speed(self) -> float:
        """The own time the scores compare: the window's lowest compute (else its median) plus its batch wait."""
        return self.own if self.floor is None else self.floor + self.data


@dataclasses.dataclass(frozen=True)
class WindowVerdict:
    """What one window says, the same on every rank.

    ``cost_seconds``: the window's straggler wait (job seconds beyond balanced steps); ``slowest``: the rank
    with the most own time; ``alarm``: the rank that stayed slow for ``windows`` windows (None: none), and
    ``kind`` whether its excess is ``compute`` or ``data``.
    """

    scores: tuple[float, ...]
    best_scores: tuple[float, ...]
    slowest: int
    cost_seconds: float
    alarm: int | None = None
    kind: str | None = None


class StragglerRules:
    """Scores every window and counts each rank's slow windows in a row (see the module docstring)."""

    def __init__(self, config: StragglerConfig, world_size: int) -> None:
        self.config = config
        self._best = [math.inf] * world_size  # each rank's lowest own time so far
        self._slow_runs = [0] * world_size
        self.alarmed: set[int] = set()

    def window(self, ranks: Sequence[RankWindow]) -> WindowVerdict:
        """Score one window of every rank's figures; an alarm is raised once per rank."""
        speeds = [r.speed for r in ranks]
        fastest = min(speeds)
        scores = tuple(_ratio(fastest, speed) for speed in speeds)
        for i, speed in enumerate(speeds):
            self._best[i] = min(self._best[i], speed)
        best_scores = tuple(_ratio(self._best[i], speed) for i, speed in enumerate(speeds))
        owns = [r.own for r in ranks]
        slowest = max(range(len(owns)), key=owns.__getitem__)
        others = [own for i, own in enumerate(owns) if i != slowest]
        balanced = statistics.median(others) if others else owns[slowest]
        cost = max(0.0, owns[slowest] - balanced) * ranks[slowest].steps
        alarm = None
        for i, score in enumerate(scores):
            slow = score < self.config.threshold and speeds[i] - fastest >= self.config.min_excess
            self._slow_runs[i] = self._slow_runs[i] + 1 if slow else 0
            if alarm is None and self._slow_runs[i] >= self.config.windows and i not in self.alarmed:
                alarm = i
        kind = None
        if alarm is not None:
            self.alarmed.add(alarm)
            kind = _kind(ranks, alarm)
        return WindowVerdict(scores, best_scores, slowest, cost, alarm, kind)


def _ratio(fast: float, slow: float) -> float:
    """fast / slow in [0, 1]; 1.0 when both are zero."""
    if slow <= 0.0:
        return 1.0
    return max(0.0, min(1.0, fast / slow))


def _kind(ranks: Sequence[RankWindow], rank: int) -> str:
    """``data`` when the rank's excess over the median rank is more in its batch wait than in its compute."""
    compute = statistics.median(r.compute for r in ranks)
    data = statistics.median(r.data for r in ranks)
    me = ranks[rank]
    return "data" if me.data - data > me.compute - compute else "compute"
