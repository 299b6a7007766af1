"""What stragglers cost: the straggler detector's ledger events read back (pure, no clocks, no files).

The detector (:mod:`goodput.run.stragglers`) writes on rank 0, once a window of steps, a ``straggler_window``
event: every rank's median compute, batch wait and wait for the others per step, its scores, and the window's
``cost_seconds``, the job time its steps took beyond balanced steps. The accounting charges that cost, spread
evenly over the window's steps, to ``straggler_wait`` (time that would otherwise read as productive: every rank's
step ends at the same collective). A ``straggler_alarm`` names a rank that stayed slow: its host and whether its
excess was compute or data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from goodput.units import format_duration as fd

if TYPE_CHECKING:
    from goodput.ledger.accounting import Accounting


def step_waits(events: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """Seconds of each step charged to ``straggler_wait``: each window's cost spread over its steps."""
    waits: dict[int, float] = {}
    for event in events:
        if event.get("event") != "straggler_window":
            continue
        first, last = int(event["first_step"]), int(event["last_step"])
        cost = float(event.get("cost_seconds") or 0.0)
        if last < first or cost <= 0.0:
            continue
        for step in range(first, last + 1):
            waits[step] = cost / (last - first + 1)
    return waits


@dataclass(frozen=True)
class RankFigures:
    """One rank over every window: mean seconds per step of its compute, batch wait and wait for the others,
    its lowest and its mean relative score (1.0: as fast as the fastest rank)."""

    rank: int
    compute: float
    data: float
    wait: float
    min_score: float
    mean_score: float


def rank_figures(windows: Iterable[Mapping[str, Any]]) -> list[RankFigures]:
    """Per rank, from ``straggler_window`` events (their fields, as the accounting's info keeps them)."""
    columns: dict[str, list[list[float]]] = {"compute": [], "data": [], "wait": [], "scores": []}
    for window in windows:
        for key, rows in columns.items():
            rows.append([float(v) for v in window.get(key, [])])
    if not columns["scores"]:
        return []
    ranks = min(len(row) for rows in columns.values() for row in rows)

    def mean(key: str, rank: int) -> float:
        return math.fsum(row[rank] for row in columns[key]) / len(columns[key])

    return [
        RankFigures(
            rank=r,
            compute=mean("compute", r),
            data=mean("data", r),
            wait=mean("wait", r),
            min_score=min(row[r] for row in columns["scores"]),
            mean_score=mean("scores", r),
        )
        for r in range(ranks)
    ]


def without_stragglers(acc: Accounting) -> tuple[float, float]:
    """(the straggler's cost in points of goodput, goodput had no rank waited for a slower one): an estimate,
    as if the ``straggler_wait`` time had been productive steps."""
    job = acc.job_seconds
    waited = acc.categories.get("straggler_wait", 0.0)
    if job <= 0:
        return 0.0, acc.goodput
    return 100.0 * waited / job, (acc.categories["productive"] + waited) / job


def _events(acc: Accounting, name: str) -> list[dict[str, Any]]:
    return [e for e in acc.info.get("stragglers", []) if e.get("event") == name]


def straggler_lines(acc: Accounting) -> list[str]:
    """The report's straggler section: per rank own time against wait, the cost, the alarms (none without
    the detector)."""
    windows = _events(acc, "straggler_window")
    if not windows:
        return []
    points, better = without_stragglers(acc)
    lines = [
        "",
        f"  stragglers: {len(windows)} window(s); straggler_wait {fd(acc.categories['straggler_wait'])} costs "
        f"{points:.1f} points of goodput; goodput without stragglers {100.0 * better:.1f}% (estimate)",
        f"    {'rank':<6}{'compute':>10}{'data':>10}{'wait':>10}{'score min':>11}{'mean':>7}   (per step)",
    ]
    for r in rank_figures(windows):
        lines.append(
            f"    {r.rank:<6}{fd(r.compute):>10}{fd(r.data):>10}{fd(r.wait):>10}{r.min_score:>11.2f}"
            f"{r.mean_score:>7.2f}"
        )
    for alarm in _events(acc, "straggler_alarm"):
        lines.append(
            f"    alarm at step {alarm.get('step')}: rank {alarm.get('straggler_rank')} on host "
            f"{alarm.get('host')} stayed slow in {alarm.get('kind')} (score {alarm.get('score')})"
        )
    return lines


def straggler_advice(acc: Accounting) -> list[tuple[str, float]]:
    """One (text, gain in points) per rank the detector raised an alarm for, naming its host."""
    points, _ = without_stragglers(acc)
    out = []
    for alarm in _events(acc, "straggler_alarm"):
        host, kind = alarm.get("host"), alarm.get("kind")
        fix = "its input pipeline or disk" if kind == "data" else "its accelerator, thermals and neighbours"
        out.append(
            (
                f"rank {alarm.get('straggler_rank')} on host {host} is a straggler ({kind}): drain {host} "
                f"(Slurm: scontrol update nodename={host} state=drain reason=straggler) or check {fix}; "
                "under --restart warm, StragglerConfig(replace=True) hands its place to a hot spare",
                points,
            )
        )
    return out
