"""A long run's steps tiled in chunks (internal to :mod:`goodput.ledger.accounting`): the same category
totals as tiling every step, with a bounded number of segments.

Tiling every step gives each its own segments (its batch wait, its compute, the gap after it): a 30-day run's
tens of millions of steps would be as many objects, and sweeping them one by one is what made its report take
minutes. Above :data:`EXACT_STEPS` steps in a run, a step that no other span (a save's stall, a restore, a
failure, init) overlaps is *clean*: its time is its fetch (``data_wait``), warm-up excess, compute
(``productive`` or ``lost_work``) and straggler wait, with nothing to arbitrate. Clean steps are summed per
chunk of consecutive steps (arrays, no per-step Python) and laid out inside the chunk's span one category after
the other; every other step is swept with the other spans as before. Every category's total, each attempt's,
and everything computed from them is the same; only the order of the categories inside a chunk is not the
steps' own, so a timeline drawn from the segments resolves a chunk, not a step.
"""

from __future__ import annotations

import numpy as np

from goodput.ledger.spans import Attempt, Spans
from goodput.ledger.tiling import Segment, StepParts, Tiling, intervals, step_parts, sweep

__all__ = ["CHUNKS", "EXACT_STEPS", "tile_attempt"]

EXACT_STEPS = 100_000  # a run with at most this many steps: every step its own segments
CHUNKS = 20_000  # above it, about this many chunks of clean steps over the run
_ORDER = ("data_wait", "warmup", "productive", "lost_work", "straggler_wait")


def tile_attempt(t: Tiling, chunk: int) -> list[Segment]:
    """One attempt's segments: every step swept one by one when ``chunk`` is 1, else clean steps in chunks of
    up to ``chunk``."""
    a, s = t.a, t.s
    if chunk <= 1 or not len(s.steps.start):
        return sweep(intervals(t), a.begin, a.end, a.number)
    dirty = _overlapped(a, s, intervals(t, only=np.zeros(len(s.steps.start), bool)))
    segments = sweep(intervals(t, only=dirty), a.begin, a.end, a.number)
    carved = _carve(segments, s, step_parts(s, t.typical[0], t.keep), ~dirty, chunk)
    if carved is None:  # a clean step outside the attempt's background time: sweep every step
        return sweep(intervals(t), a.begin, a.end, a.number)
    return carved


def _overlapped(a: Attempt, s: Spans, spans: list[tuple[float, float, str]]) -> np.ndarray:
    """Which steps another span overlaps (every step, when the steps themselves overlap or are out of order)."""
    start, end = s.steps.start, s.steps.end
    if len(start) > 1 and not (np.all(start[1:] >= end[:-1]) and np.all(end >= start)):
        return np.ones(len(start), dtype=bool)
    dirty = np.zeros(len(start), dtype=bool)
    for lo, hi, _ in spans:
        lo, hi = max(lo, a.begin), min(hi, a.end)
        if hi > lo:
            first = int(np.searchsorted(end, lo, side="right"))
            dirty[first : int(np.searchsorted(start, hi, side="left"))] = True
    return dirty


def _carve(
    segments: list[Segment], s: Spans, parts: StepParts, clean: np.ndarray, chunk: int
) -> list[Segment] | None:
    """``segments`` with each chunk of clean steps laid out in its categories; None unless every clean step
    lies inside one ``other`` segment."""
    index = clean.nonzero()[0]
    if not len(index) or not segments:
        return segments
    steps = s.steps
    start, end, fetch = steps.start[index], steps.end[index], steps.fetch[index]
    excess, lost, waited = parts.excess[index], parts.lost[index], parts.waited[index]
    owner = np.searchsorted(np.array([g.start for g in segments]), start, side="right") - 1
    at = np.maximum(owner, 0)
    other = np.array([g.category == "other" for g in segments])[at]
    if not ((owner >= 0) & other & (end <= np.array([g.end for g in segments])[at])).all():
        return None
    n = len(index)
    position = np.arange(n)
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = owner[1:] != owner[:-1]
    run_start = np.maximum.accumulate(np.where(new_run, position, 0))
    bounds = (new_run | ((position - run_start) % chunk == 0)).nonzero()[0]
    work = end - start - fetch - excess - waited
    totals = [
        np.add.reduceat(values, bounds).tolist()
        for values in (fetch, excess, np.where(lost, 0.0, work), np.where(lost, work, 0.0), waited)
    ]
    chunk_start, chunk_owner = start[bounds].tolist(), owner[bounds].tolist()
    out: list[Segment] = []
    k = 0
    for i, seg in enumerate(segments):
        if k >= len(bounds) or chunk_owner[k] != i:
            _emit(out, seg.start, seg.end, seg.category, seg.attempt)
            continue
        cursor = seg.start
        while k < len(bounds) and chunk_owner[k] == i:
            _emit(out, cursor, chunk_start[k], "other", seg.attempt)
            cursor = max(cursor, chunk_start[k])
            for category, column in zip(_ORDER, totals, strict=True):
                upto = min(seg.end, cursor + column[k])
                _emit(out, cursor, upto, category, seg.attempt)
                cursor = upto
            k += 1
        _emit(out, cursor, seg.end, "other", seg.attempt)
    return out


def _emit(out: list[Segment], lo: float, hi: float, category: str, attempt: int) -> None:
    if hi <= lo:
        return
    if out and out[-1].category == category and out[-1].end == lo:
        out[-1] = out[-1]._replace(end=hi)
    else:
        out.append(Segment(lo, hi, category, attempt))
