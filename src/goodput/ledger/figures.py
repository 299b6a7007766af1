"""The run's figures beside its categories (internal to :mod:`goodput.ledger.accounting`): what it declared
(checkpoint config, registered state, cache stats, custom events), the measured checkpoint interval, the work
at risk, and step-time statistics. Pure functions over the paired spans."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from goodput.ledger.spans import Spans

if TYPE_CHECKING:
    from goodput.ledger.accounting import SaveRecord
    from goodput.ledger.tiling import Segment


@dataclass(frozen=True)
class StepStats:
    """Statistics of completed steps' durations (fetch included) and fetch times, in seconds."""

    count: int
    mean: float
    median: float
    p90: float
    max: float
    mean_fetch: float


_META = ("event", "wall", "mono", "attempt", "rank")
_NUMERIC = (
    "numeric_fault", "rollback_nonfinite", "rollback", "skip", "sdc_named", "numeric_stop", "spike_missed",
)  # fmt: skip


def declared(spans: list[Spans]) -> dict[str, Any]:
    """Declarations (checkpoint config, registered state: the last of each), cache configs, cache stats and
    interval changes (all), and custom events tallied by name (count, and the sum of their ``seconds`` fields)."""
    info: dict[str, Any] = {"cache_stats": [], "cache_config": [], "interval_changes": [], "custom": {}}
    for s in spans:
        for event in s.info:
            fields = {k: v for k, v in event.items() if k not in _META}
            name = event["event"]
            if name in ("cache_stats", "cache_config"):  # per node: which rank recorded them
                info[name].append({**fields, "rank": event.get("rank")})
            elif name == "checkpoint_interval":
                info["interval_changes"].append(fields)
            elif name in ("checkpoint_config", "state_registered", "spike_rule", "numeric_config"):
                info[name] = fields
            elif name in ("warm_restart", "warm_first_step"):  # a warm restart's parts, as this rank saw them
                info.setdefault(name, []).append(fields)
            elif name == "restore_parts":  # the checkpoint manager's split of a restore (one per restore)
                info.setdefault("restore_parts", []).append(fields)
            elif name in ("straggler_window", "straggler_alarm"):  # the straggler detector's, in order
                info.setdefault("stragglers", []).append({"event": name, **fields})
            elif name in _NUMERIC:  # the numeric guard's ladder (goodput.run.numeric), in order
                info.setdefault("numeric", []).append({"event": name, **fields})
            else:
                tally = info["custom"].setdefault(str(name), {"count": 0, "seconds": 0.0})
                tally["count"] += 1
                seconds = fields.get("seconds")
                tally["seconds"] += float(seconds) if isinstance(seconds, int | float) else 0.0
    return info


# what a failure costs, which the planner charges per failure (goodput.ledger.report), not to the interval
_FAILURE = (
    "failure_detection", "restart_downtime", "init", "checkpoint_restore", "rollback", "reshape", "between_launches",
)  # fmt: skip


def measured_interval(
    saves: tuple[SaveRecord, ...], info: dict[str, Any], spans: list[Spans], segments: Sequence[Segment] = ()
) -> float | None:
    """Measured compute seconds between saves (stall end to next start) within attempts, else as configured.

    The time of a gap that ``segments`` put in a failure's categories (its detection, a restore or a rollback
    in place between two saves of one attempt) is left out, so the faults that fall between two saves do not
    lengthen the interval the planner is given: they are charged as failures. The rest stays, as before: the
    memory tier's stalls (the report takes their share of the interval), the training a later restore
    discarded (it was compute between saves when it ran)."""
    pairs = [
        (earlier.start if earlier.stall_end is None else earlier.stall_end, later.start)
        for earlier, later in itertools.pairwise(saves)
        if earlier.attempt == later.attempt
    ]
    elsewhere = _elsewhere(segments)
    compute = math.fsum(b - a - (elsewhere(b) - elsewhere(a)) for a, b in pairs)
    if compute > 0:  # saves with nothing but other time between them (none trained) measure no interval
        return compute / len(pairs)
    config = info.get("checkpoint_config", {})
    if config.get("interval_seconds"):
        return float(config["interval_seconds"])
    durations = np.concatenate([s.steps.end - s.steps.start for s in spans])
    if config.get("every_steps") and len(durations):
        return float(config["every_steps"]) * float(np.median(durations))
    return None


def _elsewhere(segments: Sequence[Segment]) -> Callable[[float], float]:
    """t -> the seconds before t that ``segments`` (disjoint) put in a failure's categories."""
    other = sorted(
        (seg.start, seg.end) for seg in segments if seg.category in _FAILURE and seg.end > seg.start
    )
    if not other:
        return lambda t: 0.0
    xs = np.array([x for lo, hi in other for x in (lo, hi)])
    ys = np.concatenate([[0.0], np.cumsum([x for lo, hi in other for x in (hi - lo, 0.0)])])[:-1]
    return lambda t: float(np.interp(t, xs, ys))


def memory_tier(spans: list[Spans]) -> tuple[float | None, float | None, float | None]:
    """The memory tier's measured interval (compute seconds from one memory save's stall end to the next
    one's start, within attempts), mean stall and mean persist time (its ``memory_saved`` events); None where
    the run made no such save."""
    gaps = [later[0] - earlier[1] for s in spans for earlier, later in itertools.pairwise(s.memory_stalls)]
    stalls = [end - start for s in spans for start, end in s.memory_stalls]
    persists = [
        float(e["persist_seconds"])
        for s in spans
        for e in s.info
        if e.get("event") == "memory_saved" and isinstance(e.get("persist_seconds"), int | float)
    ]
    return mean_or_none(gaps), mean_or_none(stalls), mean_or_none(persists)


def mean_or_none(values: Sequence[float]) -> float | None:
    """The exactly rounded mean of ``values``; None when there are none."""
    return math.fsum(values) / len(values) if values else None


def at_risk(spans: list[Spans], outcomes: list[str]) -> float:
    """Compute time of the running attempt's steps not yet covered by a durable checkpoint."""
    if not spans or outcomes[-1] != "running":
        return 0.0
    newest = max((step for s in spans for _, step in s.durable), default=None)
    steps = spans[-1].steps
    named = steps.number == steps.number  # NaN: a step_end that named no step
    exposed = named if newest is None else named & (steps.number > newest)
    return math.fsum((steps.end - steps.start - steps.fetch)[exposed].tolist())


def step_stats(spans: list[Spans]) -> StepStats | None:
    durations = np.concatenate([s.steps.end - s.steps.start for s in spans])
    n = len(durations)
    if not n:
        return None
    fetches = np.concatenate([s.steps.fetch for s in spans])
    p90 = min(n - 1, math.ceil(0.9 * n) - 1)
    ranked = np.partition(durations, sorted({(n - 1) // 2, n // 2, p90, n - 1}))  # order statistics only
    return StepStats(
        count=n,
        mean=math.fsum(durations.tolist()) / n,
        median=float(ranked[n // 2]) if n % 2 else float((ranked[n // 2 - 1] + ranked[n // 2]) / 2),
        p90=float(ranked[p90]),
        max=float(ranked[-1]),
        mean_fetch=math.fsum(fetches.tolist()) / n,
    )
