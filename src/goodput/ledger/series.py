"""Goodput over a run's time: the trailing-window series the report's plot draws (pure)."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from goodput.ledger.accounting import Accounting

__all__ = ["goodput_over_time"]


def goodput_over_time(acc: Accounting, *, window: float, points: int = 200) -> list[tuple[float, float]]:
    """Goodput over a trailing window, sampled at ``points`` evenly spaced times of the run.

    Args:
        acc: the run's accounting.
        window: the trailing window in seconds (the first samples use the time elapsed so far).
        points: how many samples.

    Returns:
        ``(time, goodput)`` pairs; time in seconds since the run started.
    """
    if window <= 0 or points < 1:
        raise ValueError(f"window must be > 0 and points >= 1, got window={window}, points={points}")
    segs = acc.segments
    if not segs or acc.wall_seconds <= 0:
        return []
    starts = [seg.start for seg in segs]
    cumulative = [0.0]
    for seg in segs:
        cumulative.append(cumulative[-1] + (seg.end - seg.start if seg.category == "productive" else 0.0))

    def productive_until(x: float) -> float:
        i = bisect.bisect_right(starts, x) - 1
        if i < 0:
            return 0.0
        seg = segs[i]
        inside = min(x, seg.end) - seg.start if seg.category == "productive" else 0.0
        return cumulative[i] + inside

    out = []
    for j in range(1, points + 1):
        t = acc.wall_seconds * j / points
        lo = max(0.0, t - window)
        span = t - lo  # 0 only when the run is shorter than float resolution (t underflows to 0)
        out.append((t, (productive_until(t) - productive_until(lo)) / span if span > 0 else 0.0))
    return out
