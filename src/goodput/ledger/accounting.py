"""Where every second of a run went: pure functions over ledger events (no clocks, no files).

The input is the event list of one rank or of every rank (see :mod:`goodput.ledger` for the schema), every
attempt of the run in any order; several ranks are merged first (:mod:`goodput.ledger.ranks`: one rank's time
axis, every job event once, whichever rank saw it). The output puts each instant of the run's wall time, from the first attempt's process start to
the last event of the last attempt, in exactly one category:

========================  ===========================================================================
``productive``            step compute (step time minus fetch and warm-up) kept by a later durable
                          checkpoint or by the end of the run
``data_wait``             the ``fetch_seconds`` at the start of each step
``checkpoint_stall``      the blocking part of saves (the async persist is reported as overlap)
``checkpoint_restore``    ``restore_start`` to ``restore_end``
``rollback``              the restore of a rollback in place after a numeric fault (``goodput.run.numeric``;
                          the steps it redoes are ``lost_work``)
``init``                  process start to the first step, minus restore
``warmup``                the first steps' excess over the run's median step compute
``straggler_wait``        the part of each step the ranks waited for the slowest one beyond a balanced step
                          (the straggler detector's ``straggler_window`` events, :mod:`goodput.ledger.stragglers`)
``lost_work``             steps after the checkpoint the next attempt restored (redone), and the
                          unfinished step of a failed attempt, up to one typical step's duration (the
                          work it could have done before the failure)
``restart_downtime``      from a failure to the next attempt's process start within one launch: the
                          failed attempt's time after its failure (the unfinished step's wait beyond a
                          typical step, teardown after a declared failure, the exit after torchrun's
                          SIGTERM, a warm restart's re-form) and the gap to the next attempt
``reshape``               a shrink or grow in place (no process restarted: :mod:`goodput.ledger.capacity`):
                          each one's ``seconds``, failure detected (a shrink) or newcomer ready (a grow) to
                          training resumed at the new size
``failure_detection``     last progress to the declared failure (a hang timeout, for example); before a
                          shrink, the interrupted step's wait beyond a typical step
``other``                 everything else: eval, logging, gaps between steps
``between_launches``      one launch's end to the next launch's start (a relaunch by hand, a scheduler's
                          requeue and queue wait): outside the job, so outside goodput's denominator
========================  ===========================================================================

Goodput is ``productive`` over the *job time*, the wall time minus ``between_launches``; the MTBF divides the
job time by the failures (a failed attempt, or a shrink within an attempt). *Capacity goodput* weighs each
productive second by the world size in force over the ranks the job reserved (:mod:`goodput.ledger.capacity`). A preemption (the attempt recorded ``preempted``: Ctrl-C, SIGTERM, the preemption
signal) is not a failure: it ends the attempt "preempted", and the relaunch after it is a new launch.

Where spans overlap, the earlier category in this order of precedence (``failure_detection`` >
``checkpoint_restore`` > ``checkpoint_stall`` > ``reshape`` > ``data_wait`` > ``warmup`` > ``straggler_wait`` >
``lost_work``/``productive`` > ``restart_downtime`` > ``init`` > ``other``) takes the time, so the categories
tile the wall time exactly. Step numbers follow one convention: a checkpoint "at step s" holds the state after step s, and an
attempt that restores step r redoes every step above r.

Times inside one attempt come from the monotonic clock (differences only), anchored at the attempt's
wall-clock start; attempts are laid end to end in wall-clock order (an attempt that appears to start before
the previous one ended, through clock skew, is shifted to start at that end).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from goodput.ledger.blocks import CHUNKS, EXACT_STEPS, tile_attempt
from goodput.ledger.capacity import (
    CapacityFigures,
    Reshape,
    WorldSpan,
    capacity,
    overlay,
    reserved_ranks,
    reshape_spans,
    reshapes,
    world_spans,
)
from goodput.ledger.figures import (
    StepStats,
    at_risk,
    declared,
    mean_or_none,
    measured_interval,
    memory_tier,
    step_stats,
)
from goodput.ledger.ranks import merge_ranks
from goodput.ledger.series import goodput_over_time
from goodput.ledger.spans import Attempt, Spans, kept_steps, layout, new_launch, outcome
from goodput.ledger.tiling import UNDER_RESHAPE, Segment, Tiling, rolled_back

__all__ = [
    "CATEGORIES",
    "Accounting",
    "AttemptSummary",
    "CapacityFigures",
    "Reshape",
    "SaveRecord",
    "Segment",
    "StepStats",
    "WorldSpan",
    "account",
    "goodput_over_time",
]

RESTART_PARTS = ("restart_downtime", "init", "checkpoint_restore")  # what a restart costs, R

CATEGORIES = (
    "productive",
    "data_wait",
    "checkpoint_stall",
    "checkpoint_restore",
    "rollback",
    "init",
    "warmup",
    "straggler_wait",
    "lost_work",
    "restart_downtime",
    "reshape",
    "failure_detection",
    "other",
    "between_launches",
)


@dataclass(frozen=True)
class SaveRecord:
    """One checkpoint save as seen by the ledger: blocking stall, and when it became durable (times in
    seconds since the run started)."""

    attempt: int
    step: int | None
    start: float
    stall_end: float | None
    durable: float | None
    waited: float | None = None  # of the stall: the wait for the save in flight (None: not recorded)

    @property
    def stall_seconds(self) -> float | None:
        return None if self.stall_end is None else self.stall_end - self.start

    @property
    def persist_seconds(self) -> float | None:
        """W: stall end (or save start, for a save seen only as durable) to durable; runs beside training."""
        if self.durable is None:
            return None
        return max(0.0, self.durable - (self.start if self.stall_end is None else self.stall_end))


@dataclass(frozen=True)
class AttemptSummary:
    """One attempt (a process lifetime of the run); times in seconds since the run started."""

    number: int
    start: float
    end: float
    outcome: str  # "ok" (ended cleanly), "failed", "preempted", "resized" (ended for a grow), or "running"
    steps: int
    first_step: int | None
    last_step: int | None
    restored_step: int | None
    failure_reason: str | None
    categories: dict[str, float]
    launch: int = 0  # which launch of the run (0: the first); restarts within a launch share it
    began: str = "start"  # what began it: "start", "restart", "relaunch", "rollback", "shrink" or "grow"


@dataclass(frozen=True)
class Accounting:
    """The whole account of a run; ``categories`` sums to ``wall_seconds``.

    ``start`` and ``end`` are wall-clock times (seconds since the epoch); every other time (segments,
    attempts, saves) is in seconds since ``start``. ``job_seconds`` is the wall time minus
    ``between_launches``: goodput, the MTBF and every share the report gives are of the job time.
    ``restarts`` counts restarts within launches; ``failures`` excludes ``preemptions``.
    """

    start: float
    end: float
    wall_seconds: float
    categories: dict[str, float]
    goodput: float
    segments: tuple[Segment, ...]
    attempts: tuple[AttemptSummary, ...]
    saves: tuple[SaveRecord, ...]
    restarts: int
    failures: int
    mtbf_seconds: float | None
    ckpt_stall_seconds: float | None
    persist_seconds: float | None
    overlap_seconds: float
    restart_seconds: float | None
    detect_seconds: float | None
    interval_seconds: float | None
    at_risk_seconds: float
    step_stats: StepStats | None
    info: dict[str, Any]
    launches: int = 1
    preemptions: int = 0
    capacity: CapacityFigures | None = None
    reshapes: tuple[Reshape, ...] = ()
    world: tuple[WorldSpan, ...] = ()
    memory_interval_seconds: float | None = None  # the memory tier's, when it saved (ledger/figures.py)
    memory_stall_seconds: float | None = None
    memory_persist_seconds: float | None = None
    restart_parts: dict[str, float] = field(default_factory=dict)  # RESTART_PARTS' means; they sum to R
    restart_samples: int = 0  # the process starts R is the mean of: restarts, and relaunches after a failure
    rollback_seconds: float | None = None  # a rollback in place: its restart_downtime + rollback, mean
    ckpt_wait_seconds: float | None = None  # of C: the mean wait for the save in flight (None: not recorded)

    @property
    def capacity_goodput(self) -> float:
        """Productive rank-seconds over reserved rank-seconds (:mod:`goodput.ledger.capacity`)."""
        return self.capacity.capacity_goodput if self.capacity is not None else self.goodput

    @property
    def job_seconds(self) -> float:
        """Wall time minus the time between launches: the time the job ran, goodput's denominator."""
        return self.wall_seconds - self.categories.get("between_launches", 0.0)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary (no segments)."""
        skip = ("segments", "saves", "attempts", "world")
        out = {k: v for k, v in asdict(self).items() if k not in skip}
        out["attempts"] = [asdict(a) for a in self.attempts]
        out["job_seconds"] = self.job_seconds
        out["capacity_goodput"] = self.capacity_goodput
        out["world"] = [[w.start, w.end, w.world, w.reserved] for w in self.world]
        return out


def account(
    events: Iterable[Mapping[str, Any]],
    *,
    rank: int | None = None,
    records: Mapping[tuple[int, int], np.ndarray] | None = None,
    exact_steps: int = EXACT_STEPS,
) -> Accounting:
    """Account for every second of a run from its ledger events.

    Args:
        events: event dicts of one rank or of every rank, every attempt, as read by
            :func:`goodput.ledger.read_events`.
        rank: whose time axis to use when several ranks are given (None: the lowest present); every
            rank's failures and custom events count either way, each job event once.
        records: that rank's step records by (attempt, rank), for attempts whose steps are not among the
            events (:func:`goodput.ledger.files.read_ledger`).
        exact_steps: up to this many steps, every step gets its own segments; above, steps no other span
            overlaps are tiled in chunks (:mod:`goodput.ledger.blocks`: the same totals).

    Returns:
        The categories (summing to the wall time), goodput, restarts, MTBF, measured C and W, and more.

    Raises:
        ValueError: when there is no ``attempt_start`` event to anchor the time axis.
    """
    attempts, origin = layout(merge_ranks(events, primary=rank), records)
    if not attempts:
        raise ValueError("the ledger has no attempt_start event: nothing to account for")
    spans = [Spans(a) for a in attempts]
    outcomes = _resized([outcome(i, len(spans), s) for i, s in enumerate(spans)], spans)
    keeps = kept_steps(spans, attempts, outcomes)
    durations = np.concatenate([s.steps.end - s.steps.start for s in spans])
    computes = np.concatenate([s.steps.end - s.steps.start - s.steps.fetch for s in spans])
    typical = float(np.median(computes)) if len(computes) else 0.0
    step_median = float(np.median(durations)) if len(durations) else 0.0
    launches = _launch_numbers(attempts)
    chunk = 1 if len(durations) <= exact_steps else max(2, -(-len(durations) // CHUNKS))
    tiles: list[list[Segment]] = []  # per attempt
    carried: list[Segment] = []  # a failed attempt's downtime, charged to the restart that follows it
    for i, (a, s) in enumerate(zip(attempts, spans, strict=True)):
        failed = outcomes[i] == "failed"
        own = tile_attempt(Tiling(a, s, (typical, step_median), keeps[i], failed), chunk)
        before = [seg._replace(attempt=a.number) for seg in carried]
        if i > 0 and a.begin > attempts[i - 1].end:  # the time before an attempt is charged to it
            gap = "between_launches" if launches[i] != launches[i - 1] else "restart_downtime"
            before.append(Segment(attempts[i - 1].end, a.begin, gap, a.number))
        carried = []
        if failed and i + 1 < len(attempts) and launches[i + 1] == launches[i]:
            carried = [seg for seg in own if seg.category == "restart_downtime"]
            own = [seg for seg in own if seg.category != "restart_downtime"]
        resizing = reshape_spans(a, s)  # may reach back into the attempt before (the one that ended for it)
        if tiles:
            tiles[-1] = overlay(tiles[-1], resizing, UNDER_RESHAPE)
        tiles.append(overlay(before + own, resizing, UNDER_RESHAPE))
    per_attempt = [_sum(own) for own in tiles]
    segments = [seg for own in tiles for seg in own]
    segments.sort(key=lambda seg: seg.start)  # carried segments interleave with declared detections
    start, end = origin, origin + attempts[-1].end
    categories = _sum(segments)
    wall = attempts[-1].end - attempts[0].begin
    acc = _assemble(attempts, spans, outcomes, segments, per_attempt, categories, start, end, wall, launches)
    reserved = reserved_ranks(attempts, spans, launches)
    worlds, resized = world_spans(attempts, spans, reserved), reshapes(attempts, spans)
    figures = capacity(acc.segments, worlds, resized, reserved, attempts[-1].end)
    return replace(acc, capacity=figures, reshapes=resized, world=worlds)


def _resized(outcomes: list[str], spans: list[Spans]) -> list[str]:
    """An attempt whose group ended it to take a newcomer back (the next begins with a grow) did not fail:
    its outcome is ``resized`` and its declared end is no failure detection."""
    for i in range(len(spans) - 1):
        if (
            outcomes[i] == "failed"
            and spans[i + 1].reshaped_start("grow")
            and not spans[i + 1].reshaped_start("shrink")
        ):
            outcomes[i] = "resized"
            spans[i].detect, spans[i].failure_reason = [], None
    return outcomes


def _launch_numbers(attempts: list[Attempt]) -> list[int]:
    """Each attempt's launch: 0 for the first, one more at each attempt that began a new launch."""
    numbers = [0]
    for previous, attempt in itertools.pairwise(attempts):
        numbers.append(numbers[-1] + (1 if new_launch(previous, attempt) else 0))
    return numbers


def _sum(segments: Iterable[Segment]) -> dict[str, float]:
    parts: dict[str, list[float]] = {name: [] for name in CATEGORIES}
    for seg in segments:
        parts[seg.category].append(seg.end - seg.start)
    return {name: math.fsum(values) for name, values in parts.items()}


def _save_records(attempts: list[Attempt], spans: list[Spans]) -> tuple[SaveRecord, ...]:
    """Every save, in the attempt that began it. A save in flight when its attempt ended in the same process (a
    rollback in place) turns durable in the next one, which records only that durable event: it is the earlier
    attempt's save, with that durable time, not a save of the next."""
    records: list[SaveRecord] = []
    for a, s in zip(attempts, spans, strict=True):
        for sv in s.saves:
            step = None if sv[0] is None else int(sv[0])
            if not sv[4] and sv[1] < a.begin:  # no stall here, begun before this attempt
                begun = [
                    i
                    for i, r in enumerate(records)
                    if r.durable is None and r.step == step and step is not None
                ]
                if begun:
                    records[begun[-1]] = replace(records[begun[-1]], durable=sv[3])
                    continue
            records.append(SaveRecord(a.number, step, sv[1], sv[2], sv[3], sv[5]))
    return tuple(records)


def _assemble(
    attempts: list[Attempt],
    spans: list[Spans],
    outcomes: list[str],
    segments: list[Segment],
    per_attempt: list[dict[str, float]],
    categories: dict[str, float],
    start: float,
    end: float,
    wall: float,
    launches: list[int],
) -> Accounting:
    saves = _save_records(attempts, spans)
    failures = outcomes.count("failed") + sum(s.in_place_failures() for s in spans)
    in_place = [i > 0 and (rolled_back(s) or s.reshaped_start()) for i, s in enumerate(spans)]
    # R: every process start that answered a failure, a relaunch after a failed launch too (its start-up is
    # the failure's cost, its wait between launches is not the job's)
    restarted = [
        cats
        for i, cats in enumerate(per_attempt)
        if i > 0 and outcomes[i - 1] == "failed" and not in_place[i]
    ]
    parts = {k: mean_or_none([c[k] for c in restarted]) for k in RESTART_PARTS}
    rollbacks = [
        c["restart_downtime"] + c["rollback"]
        for c, s in zip(per_attempt, spans, strict=True)
        if rolled_back(s)
    ]
    stalls = [sv.stall_seconds for sv in saves if sv.stall_seconds is not None]
    persists = [sv.persist_seconds for sv in saves if sv.persist_seconds is not None]
    info = declared(spans)
    job = wall - categories["between_launches"]
    memory_interval, memory_stall, memory_persist = memory_tier(spans)
    return Accounting(
        start=start,
        end=end,
        wall_seconds=wall,
        categories=categories,
        goodput=categories["productive"] / job if job > 0 else 0.0,
        segments=tuple(segments),
        attempts=tuple(
            replace(_summary(a, s, o, c, n), began=_began(i, s, launches))
            for i, (a, s, o, c, n) in enumerate(
                zip(attempts, spans, outcomes, per_attempt, launches, strict=True)
            )
        ),
        saves=saves,
        # a rollback, a shrink or a grow in place restarts nothing
        restarts=len(attempts) - 1 - launches[-1] - sum(in_place),
        failures=failures,
        mtbf_seconds=job / failures if failures else None,
        ckpt_stall_seconds=mean_or_none(stalls),
        ckpt_wait_seconds=mean_or_none([sv.waited for sv in saves if sv.waited is not None]),
        persist_seconds=mean_or_none(persists),
        overlap_seconds=math.fsum(sv.persist_seconds or 0.0 for sv in saves),
        restart_seconds=math.fsum(v or 0.0 for v in parts.values()) if restarted else None,
        restart_parts={k: v or 0.0 for k, v in parts.items()} if restarted else {},
        restart_samples=len(restarted),
        rollback_seconds=mean_or_none(rollbacks),
        detect_seconds=categories["failure_detection"] / failures if failures else None,
        interval_seconds=measured_interval(saves, info, spans, segments),
        at_risk_seconds=at_risk(spans, outcomes),
        step_stats=step_stats(spans),
        info=info,
        launches=launches[-1] + 1,
        preemptions=outcomes.count("preempted"),
        memory_interval_seconds=memory_interval,
        memory_stall_seconds=memory_stall,
        memory_persist_seconds=memory_persist,
    )


def _began(i: int, s: Spans, launches: list[int]) -> str:
    """What began attempt ``i``: the run's start, a restart or relaunch, or an attempt opened in place."""
    if i == 0:
        return "start"
    if rolled_back(s):
        return "rollback"
    for kind in ("shrink", "grow"):
        if s.reshaped_start(kind):
            return kind
    return "relaunch" if launches[i] != launches[i - 1] else "restart"


def _summary(a: Attempt, s: Spans, outcome: str, categories: dict[str, float], launch: int) -> AttemptSummary:
    numbers = s.steps.number[s.steps.number == s.steps.number]  # NaN: a step_end that named no step
    return AttemptSummary(
        number=a.number,
        start=a.begin,
        end=a.end,
        outcome=outcome,
        steps=len(s.steps.start),
        first_step=int(numbers.min()) if len(numbers) else None,
        last_step=int(numbers.max()) if len(numbers) else None,
        restored_step=s.restored_step,
        failure_reason=s.failure_reason if outcome == "failed" else None,
        categories=categories,
        launch=launch,
    )
