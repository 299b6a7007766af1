"""One attempt's spans tiled into categories: each instant takes the category of highest precedence among the
spans covering it (internal to :mod:`goodput.ledger.accounting`, whose docstring defines the categories)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from goodput.ledger.spans import Attempt, Spans
from goodput.ledger.stragglers import step_waits

# Precedence where spans overlap: lower index wins. "other" is the background.
_PRECEDENCE = (
    "failure_detection",
    "checkpoint_restore",
    "rollback",
    "checkpoint_stall",
    "reshape",
    "data_wait",
    "warmup",
    "straggler_wait",
    "lost_work",
    "productive",
    "restart_downtime",
    "init",
    "other",
)
_RANK = {name: i for i, name in enumerate(_PRECEDENCE)}
UNDER_RESHAPE = frozenset(_PRECEDENCE[_RANK["reshape"] + 1 :])  # what a shrink's or grow's time takes over

# A step whose compute exceeds this multiple of the run's median is a warm-up step (while at the start).
WARMUP_FACTOR = 1.5


class Segment(NamedTuple):
    """A stretch of wall time in one category (times in seconds since the run started)."""

    start: float
    end: float
    category: str
    attempt: int


def sweep(intervals: list[tuple[float, float, str]], begin: float, end: float, attempt: int) -> list[Segment]:
    """Tile [begin, end] with segments, each taking the highest-precedence interval covering it."""
    points: list[tuple[float, int, int]] = []
    for lo, hi, category in intervals:
        lo, hi = max(lo, begin), min(hi, end)
        if hi > lo:
            points.append((lo, 1, _RANK[category]))
            points.append((hi, -1, _RANK[category]))
    points.sort()
    counts = [0] * len(_PRECEDENCE)
    segments: list[Segment] = []
    cursor = begin

    def emit(upto: float) -> None:
        if upto <= cursor:
            return
        top = next((i for i, c in enumerate(counts) if c > 0), _RANK["other"])
        category = _PRECEDENCE[top]
        if segments and segments[-1].category == category and segments[-1].end == cursor:
            segments[-1] = segments[-1]._replace(end=upto)
        else:
            segments.append(Segment(cursor, upto, category, attempt))

    for t, delta, rank in points:
        emit(t)
        cursor = max(cursor, t)
        counts[rank] += delta
    emit(end)
    return segments


class StepParts(NamedTuple):
    """Per completed step: its warm-up excess, whether it was lost (redone later) and its straggler wait."""

    excess: np.ndarray
    lost: np.ndarray
    waited: np.ndarray


def step_parts(s: Spans, compute_median: float, keep: tuple[int | None, bool]) -> StepParts:
    """What of each step is warm-up (the attempt's first steps while their compute exceeds
    ``WARMUP_FACTOR`` times the run's median), lost, or waiting for a straggler."""
    steps = s.steps
    compute = steps.end - steps.start - steps.fetch
    slow = compute > WARMUP_FACTOR * compute_median
    warming = len(slow) if slow.all() else int(np.argmin(slow))  # the leading run of slow steps
    excess = np.zeros(len(compute))
    excess[:warming] = compute[:warming] - compute_median
    named = steps.number == steps.number  # NaN: a step_end that named no step
    last_kept, applies = keep
    if not applies:
        lost = np.zeros(len(compute), dtype=bool)
    else:
        lost = ~named if last_kept is None else ~named | (steps.number > last_kept)
        lost = lost | (last_kept is None)
    waits = step_waits(s.info)
    waited = np.zeros(len(compute))
    if waits:
        keys = np.fromiter(waits, dtype=float, count=len(waits))
        values = np.fromiter(waits.values(), dtype=float, count=len(waits))
        order = np.argsort(keys)
        keys, values = keys[order], values[order]
        at = np.minimum(np.searchsorted(keys, steps.number), len(keys) - 1)
        found = named & (keys[at] == steps.number)
        waited[found] = np.minimum(values[at][found], (compute - excess)[found])
    return StepParts(excess, lost, waited)


class Tiling(NamedTuple):
    """One attempt to tile, and what that needs of the run: ``typical``, the run's median step compute and
    median step duration; ``keep``, its last kept step and whether steps above it are lost; whether it failed."""

    a: Attempt
    s: Spans
    typical: tuple[float, float]
    keep: tuple[int | None, bool]
    failed: bool


def intervals(t: Tiling, only: np.ndarray | None = None) -> list[tuple[float, float, str]]:
    """Every span of one attempt with its category; ``only``: which steps (a mask; default every one)."""
    a, s, (compute_median, step_median), keep, failed = t
    out: list[tuple[float, float, str]] = []
    steps = s.steps
    first_step = float(steps.start[0]) if len(steps.start) else (s.open_step[0] if s.open_step else a.end)
    out.append((a.begin, first_step, "init"))
    restore = "rollback" if rolled_back(s) else "checkpoint_restore"
    out.extend((lo, hi, restore) for lo, hi in s.restores)
    out.extend((lo, hi, "checkpoint_stall") for lo, hi in s.memory_stalls)
    out.extend((lo, hi, "checkpoint_stall") for lo, hi in s.retry_pauses)
    for save in s.saves:
        if save[4]:
            out.append((save[1], a.end if save[2] is None else save[2], "checkpoint_stall"))
    out.extend((lo, hi, "failure_detection") for lo, hi in s.detect)
    parts = step_parts(s, compute_median, keep)
    chosen = slice(None) if only is None else only
    for start, end, fetch, excess, lost, waited in zip(
        steps.start[chosen].tolist(),
        steps.end[chosen].tolist(),
        steps.fetch[chosen].tolist(),
        parts.excess[chosen].tolist(),
        parts.lost[chosen].tolist(),
        parts.waited[chosen].tolist(),
        strict=True,
    ):
        out.append((start, start + fetch, "data_wait"))
        out.append((start + fetch, start + fetch + excess, "warmup"))
        out.append((end - waited, end, "straggler_wait"))
        out.append((start + fetch + excess, end, "lost_work" if lost else "productive"))
    for start, detected in s.interrupted:  # a step a shrink's failure interrupted: as a failed attempt's
        worked = min(detected, start + step_median) if step_median > 0 else detected
        out += [(start, worked, "lost_work"), (worked, detected, "failure_detection")]
    if failed:
        out.extend(_after_failure(a, s, step_median))
    return out


def _after_failure(a: Attempt, s: Spans, step_median: float) -> list[tuple[float, float, str]]:
    """A failed attempt's unfinished step, and its time after the failure.

    The unfinished step was thrown away, but only as much of it as a typical step lasts was work: beyond that
    the rank was waiting on a dead peer, re-forming a warm restart's group, or exiting after torchrun's
    SIGTERM, all of it downtime. So is everything after a declared failure (teardown). A declared
    detection inside keeps its span: ``failure_detection`` takes precedence.
    """
    if s.open_step is not None:
        start = s.open_step[0]
        stop = min((lo for lo, _ in s.detect if lo >= start), default=a.end)
        worked = min(stop, start + step_median) if step_median > 0 else stop
        return [(start, worked, "lost_work"), (worked, a.end, "restart_downtime")]
    if s.detect:
        return [(max(hi for _, hi in s.detect), a.end, "restart_downtime")]
    return []


def rolled_back(s: Spans) -> bool:
    """Whether this attempt began with a rollback in place (its restore is ``rollback``, not a restart's)."""
    return any(e.get("event") == "rollback" for e in s.info)
