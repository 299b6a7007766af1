"""Capacity: the world size over a run, its shrinks and grows, and capacity goodput (pure; internal to
:mod:`goodput.ledger.accounting`).

Time goodput counts a second of training as productive whatever the number of ranks that trained in it. A job
that lost a rank and went on with the survivors (a ``shrink``, until a ``grow`` takes a rank back) is
productive, but not at full capacity: *capacity goodput* weighs each productive second by the world size in
force over the ranks the job reserved,

    capacity goodput = productive rank-seconds / reserved rank-seconds

where the world size in force is that of the attempt's ``attempt_start``, then of each ``shrink`` and ``grow``
(``world_after``, from the event's time on), and the reserved ranks are a launch's (the most any of its attempts
recorded in ``reserved_world`` or ran with: a launch's reservation does not shrink with its group). The reserved
rank-seconds are the job time (no ``between_launches``) times the reserved ranks. A job that runs at its
reserved size throughout has capacity goodput equal to its goodput.

Each shrink and grow costs the time from the failure detected (a shrink) or the newcomer ready (a grow), its
event's ``seconds`` before the event, to training resumed at the new size (the next step's start: a group that
re-formed in a new attempt rebuilds its wrappers and loader after the event): that time is ``reshape`` badput,
over whatever the attempts' spans made of it.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from goodput.ledger.figures import mean_or_none
from goodput.ledger.spans import Attempt, Spans

if TYPE_CHECKING:
    from goodput.ledger.tiling import Segment


@dataclass(frozen=True)
class Reshape:
    """One shrink or grow: ``at`` is when it was recorded (seconds since the run started), ``seconds`` its cost
    (failure detected for a shrink, newcomer ready for a grow, to training resumed at the new size)."""

    kind: str  # "shrink" or "grow"
    at: float
    seconds: float
    step: int | None
    world_before: int
    world_after: int
    attempt: int
    failed_ranks: tuple[int, ...] = ()
    joined: int = 0
    batch_rule: str | None = None
    generation: int | None = None


@dataclass(frozen=True)
class WorldSpan:
    """A stretch of an attempt at one world size, with the ranks its launch reserved."""

    start: float
    end: float
    world: int
    reserved: int


@dataclass(frozen=True)
class CapacityFigures:
    """Capacity over the run: capacity goodput and its two rank-second sums, the time the world size was
    below the reservation, and the mean costs of shrinks and grows (None where none happened).

    ``regrow_seconds`` is the mean time from a shrink's failure detected to a replacement ready to join (the
    grow's start), over the failed ranks a grow took back; ``reduced_per_shrink`` is the mean time after a
    shrink that the group trained short of that rank (to its grow's start, or to the run's end).
    """

    capacity_goodput: float
    productive_rank_seconds: float
    reserved_rank_seconds: float
    reserved_world: int
    reduced_seconds: float
    shrink_seconds: float | None
    grow_seconds: float | None
    regrow_seconds: float | None
    reduced_per_shrink: float | None


def reshapes(attempts: Sequence[Attempt], spans: Sequence[Spans]) -> tuple[Reshape, ...]:
    """Every shrink and grow of the run, in time order."""
    out = []
    for a, s in zip(attempts, spans, strict=True):
        for (lo, hi), (t, e) in zip(reshape_spans(a, s), s.reshapes, strict=True):
            failed = e.get("failed_ranks") or ()
            out.append(
                Reshape(
                    kind=str(e["event"]),
                    at=t,
                    seconds=hi - lo,
                    step=None if e.get("step") is None else int(e["step"]),
                    world_before=int(e.get("world_before") or 0),
                    world_after=int(e.get("world_after") or 0),
                    attempt=a.number,
                    failed_ranks=tuple(int(r) for r in failed),
                    joined=int(e.get("joined") or 0),
                    batch_rule=None if e.get("batch_rule") is None else str(e["batch_rule"]),
                    generation=None if e.get("generation") is None else int(e["generation"]),
                )
            )
    return tuple(sorted(out, key=lambda r: r.at))


def reshape_spans(a: Attempt, s: Spans) -> list[tuple[float, float]]:
    """The ``reshape`` time of one attempt: from each shrink's and grow's ``seconds`` before it to training
    resumed."""
    return [(t - max(0.0, float(e.get("seconds") or 0.0)), s.resumed(t, a.end)) for t, e in s.reshapes]


def overlay(
    segments: list[Segment], spans: list[tuple[float, float]], weaker: frozenset[str]
) -> list[Segment]:
    """``segments`` with the parts inside ``spans`` whose category is in ``weaker`` relabelled ``reshape``.

    A shrink's time may begin in the attempt before the one that records it (a survivor that closed the
    failed generation's attempt and opened the next): the overlay reaches back over the carried downtime.
    """
    for lo, hi in spans:
        if hi <= lo:
            continue
        out: list[Segment] = []
        for seg in segments:
            if seg.category not in weaker or seg.end <= lo or seg.start >= hi:
                out.append(seg)
                continue
            a, b = max(seg.start, lo), min(seg.end, hi)
            if seg.start < a:
                out.append(seg._replace(end=a))
            out.append(seg._replace(start=a, end=b, category="reshape"))
            if b < seg.end:
                out.append(seg._replace(start=b))
        segments = out
    return segments


def reserved_ranks(
    attempts: Sequence[Attempt], spans: Sequence[Spans], launches: Sequence[int]
) -> dict[int, int]:
    """Attempt number -> the ranks its launch reserved (the most any attempt of the launch reserved or ran)."""
    by_launch: dict[int, int] = {}
    for a, s, launch in zip(attempts, spans, launches, strict=True):
        most = max([a.reserved, a.world, *(int(e.get("world_before") or 0) for _, e in s.reshapes)])
        by_launch[launch] = max(by_launch.get(launch, 0), most)
    return {a.number: by_launch[launch] for a, launch in zip(attempts, launches, strict=True)}


def world_spans(
    attempts: Sequence[Attempt], spans: Sequence[Spans], reserved: dict[int, int]
) -> tuple[WorldSpan, ...]:
    """The world size in force over each attempt, with its launch's reserved ranks."""
    out = []
    for a, s in zip(attempts, spans, strict=True):
        changes = [(a.begin, a.world)]
        changes += [
            (t, int(e["world_after"])) for t, e in s.reshapes if isinstance(e.get("world_after"), int)
        ]
        changes.sort(key=lambda c: c[0])
        for (start, world), (end, _) in zip(changes, [*changes[1:], (a.end, 0)], strict=True):
            if end > start:
                out.append(WorldSpan(start, end, world, reserved[a.number]))
    return tuple(out)


def capacity(
    segments: Sequence[Segment],
    worlds: Sequence[WorldSpan],
    events: Sequence[Reshape],
    reserved_by_attempt: dict[int, int],
    end: float,
) -> CapacityFigures:
    """Capacity goodput and the figures of :class:`CapacityFigures` (``end``: the run's last time)."""
    starts = [w.start for w in worlds]
    productive = math.fsum(
        _rank_seconds(worlds, starts, seg.start, seg.end) for seg in segments if seg.category == "productive"
    )
    reserved = math.fsum(
        (seg.end - seg.start) * reserved_by_attempt.get(seg.attempt, 1)
        for seg in segments
        if seg.category != "between_launches"
    )
    shrinks = [r for r in events if r.kind == "shrink"]
    grows = [r for r in events if r.kind == "grow"]
    regrow, reduced = _regrow(shrinks, grows, end)
    return CapacityFigures(
        capacity_goodput=productive / reserved if reserved > 0 else 0.0,
        productive_rank_seconds=productive,
        reserved_rank_seconds=reserved,
        reserved_world=max((w.reserved for w in worlds), default=1),
        reduced_seconds=math.fsum(w.end - w.start for w in worlds if w.world < w.reserved),
        shrink_seconds=mean_or_none([r.seconds for r in shrinks]),
        grow_seconds=mean_or_none([r.seconds for r in grows]),
        regrow_seconds=mean_or_none(regrow),
        reduced_per_shrink=mean_or_none(reduced),
    )


def _rank_seconds(worlds: Sequence[WorldSpan], starts: list[float], lo: float, hi: float) -> float:
    """The integral of the world size in force over [lo, hi]."""
    total = 0.0
    i = max(0, bisect.bisect_right(starts, lo) - 1)
    while i < len(worlds) and worlds[i].start < hi:
        w = worlds[i]
        inside = min(hi, w.end) - max(lo, w.start)
        if inside > 0:
            total += inside * w.world
        i += 1
    return total


def _regrow(shrinks: list[Reshape], grows: list[Reshape], end: float) -> tuple[list[float], list[float]]:
    """Per failed rank taken back: failure detected to replacement ready; per failed rank: the time the
    group trained short of it (its shrink to the grow's start, or to ``end``). First lost, first regrown."""
    missing: deque[Reshape] = deque()
    regrow: list[float] = []
    reduced: list[float] = []
    timeline: list[tuple[float, int, Reshape]] = [(r.at, 0, r) for r in shrinks]
    timeline += [(r.at, 1, r) for r in grows]
    for _, kind, r in sorted(timeline, key=lambda x: (x[0], x[1])):
        if kind == 0:
            missing.extend([r] * max(1, r.world_before - r.world_after))
            continue
        ready = r.at - r.seconds
        for _ in range(max(1, r.world_after - r.world_before)):
            if not missing:
                break
            lost = missing.popleft()
            regrow.append(max(0.0, ready - (lost.at - lost.seconds)))
            reduced.append(max(0.0, ready - lost.at))
    reduced += [max(0.0, end - lost.at) for lost in missing]
    return regrow, reduced
