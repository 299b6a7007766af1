"""When to save: every N steps, every T seconds, or ``auto`` (the planner's optimum, re-evaluated as saves
are measured and failures observed).

Policies own no clock: the caller passes ``now`` (monotonic seconds). ``auto`` sets the interval to
``goodput.planning.optimal_interval`` of the measured blocking stall C and persist time W and the failure rate,
bounded below by W (a save cannot start before the previous one is durable) and above by the user's maximum.
Every change of the interval is logged.

The failure rate before any failure is observed: a prior MTBF ``M0`` (``CheckpointConfig.prior_mtbf``: short,
so that a new job, whose failure rate nobody knows, saves often) plus the failure-free time ``T`` seen so far,
``M0 + T``: the mean of a gamma prior on the rate worth one failure in ``M0``, updated by ``T`` seconds without
one. Saving too often costs a bounded, measured share C/interval; saving too rarely loses up to an interval per
failure, so the prior errs towards the first, and the interval grows as the job proves itself. Observed
failures (``observe_mtbf``) replace it.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from goodput.checkpoint.config import CheckpointConfig

__all__ = [
    "AutoInterval",
    "EveryInterval",
    "EverySteps",
    "SavePolicy",
    "StepSchedule",
    "interval_events",
    "tier_policy",
]

log = logging.getLogger(__name__)


class SavePolicy(Protocol):
    """Decides whether a step should be saved."""

    def due(self, step: int, now: float) -> bool:
        """Whether to save at ``step`` (called once per step)."""
        ...

    def saved(self, step: int, now: float) -> None:
        """A save of ``step`` started at ``now`` (or the run resumed from it)."""
        ...

    def measured(self, stall: float, persist: float) -> None:
        """A save completed: it blocked training ``stall`` seconds and was durable after ``persist``."""
        ...


class EverySteps:
    """Save at every step that is a multiple of ``n`` (the same steps on every rank and every restart)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._last: int | None = None

    def due(self, step: int, now: float) -> bool:
        return step > 0 and step % self.n == 0 and step != self._last

    def saved(self, step: int, now: float) -> None:
        self._last = step

    def measured(self, stall: float, persist: float) -> None:
        pass


class EveryInterval:
    """Save when ``interval`` seconds have passed since the last save (or since the first step seen)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last_time: float | None = None
        self._last_step: int | None = None

    def due(self, step: int, now: float) -> bool:
        return self.due_within(step, now, 0.0)

    def due_within(self, step: int, now: float, slack: float) -> bool:
        """Whether at most ``slack`` seconds of the interval are left (``due`` is ``slack=0``)."""
        if self._last_time is None:
            self._last_time = now
            return False
        return step != self._last_step and now - self._last_time >= self.interval - slack

    def saved(self, step: int, now: float) -> None:
        self._last_time = now
        self._last_step = step

    @property
    def last_time(self) -> float | None:
        """When the last save started (or the first step was seen); None before that."""
        return self._last_time

    def measured(self, stall: float, persist: float) -> None:
        pass


class AutoInterval(EveryInterval):
    """The planner's optimal interval from measured save costs and the failure rate, within bounds.

    Args:
        mtbf: prior mean time between failures of the whole job, seconds; until ``observe_mtbf`` the interval
            is planned for ``mtbf`` plus the failure-free seconds seen so far (see the module).
        max_interval: never wait longer than this between saves.
        restart: seconds a restart costs.
        detect: seconds until a failure is noticed.
        first_interval: the interval before any save has been measured (bounded by ``max_interval``). The
            default, 0, saves at the second step: the optimum needs the measured cost of a save.
        window: how many recent saves the stall/persist estimates are the median of.
        on_change: called with (new interval, reason, stall, persist: the save costs it was planned with) when
            the interval moves by more than 10% from the last value reported (the ledger records it as
            ``checkpoint_interval``, and a later attempt resumes from those costs: ``resume``).

    ``failure_share`` (1 unless set): the share of the job's failures this tier recovers. With a memory tier
    the durable tier recovers only the failures the memory tier cannot, so its optimum uses ``mtbf / share``
    (two-level checkpointing, see ``goodput.planning.twolevel``).
    """

    def __init__(
        self,
        *,
        mtbf: float,
        max_interval: float,
        restart: float = 0.0,
        detect: float = 0.0,
        first_interval: float = 0.0,
        window: int = 5,
        on_change: Callable[[float, str, float, float], None] | None = None,
    ) -> None:
        super().__init__(min(first_interval, max_interval))
        self.mtbf = mtbf
        self.max_interval = max_interval
        self.restart = restart
        self.detect = detect
        self._stalls: deque[float] = deque(maxlen=window)
        self._persists: deque[float] = deque(maxlen=window)
        self._failures: list[float] = []
        self._on_change = on_change
        self._reported: float | None = None
        self._observed = False
        self._span: tuple[float, float] | None = None  # the first and the latest ``now`` seen
        self.failure_share = 1.0

    def due_within(self, step: int, now: float, slack: float) -> bool:
        self._seen(now)
        return super().due_within(step, now, slack)

    def saved(self, step: int, now: float) -> None:
        self._seen(now)
        super().saved(step, now)

    def _seen(self, now: float) -> None:
        self._span = (now, now) if self._span is None else (self._span[0], max(self._span[1], now))

    @property
    def planned_mtbf(self) -> float:
        """The job's MTBF the interval is planned for: the observed one, else the prior plus the failure-free
        seconds seen so far (before ``failure_share``)."""
        if self._observed or self._span is None:
            return self.mtbf
        return self.mtbf + (self._span[1] - self._span[0])

    def measured(self, stall: float, persist: float) -> None:
        self._stalls.append(stall)
        self._persists.append(persist)
        self._update("a save was measured")

    def resume(self, stall: float, persist: float) -> None:
        """Plan with the save costs an earlier attempt of the run measured until this one measures its own (a
        restarted job would otherwise start from ``first_interval`` and save on consecutive steps again)."""
        if not self._stalls:
            self._stalls.append(stall)
            self._persists.append(persist)
            self._update("an earlier attempt's save costs")

    def observe_mtbf(self, mtbf: float) -> None:
        """Replace the prior with an observed mean time between failures (seconds)."""
        if mtbf > 0:
            self.mtbf = mtbf
            self._observed = True
            self._update("the failure rate was updated")

    def _update(self, why: str) -> None:
        from goodput.planning import Costs, optimal_interval

        if not self._stalls:
            return
        stall = statistics.median(self._stalls)
        persist = statistics.median(self._persists)
        mtbf = self.planned_mtbf / max(self.failure_share, 1e-9)
        best = optimal_interval(
            Costs(ckpt_stall=stall, mtbf=mtbf, restart=self.restart, persist=persist, detect=self.detect)
        )
        new = min(max(best, persist), self.max_interval)
        if abs(new - self.interval) > 1e-9 * max(1.0, self.interval):
            log.info(
                "checkpoint interval %.1fs -> %.1fs (%s: stall %.3fs, persist %.3fs, MTBF %.0fs; planner %.1fs,"
                " bounds [%.1fs, %.1fs])",
                self.interval, new, why, stall, persist, mtbf, best, persist, self.max_interval,
            )  # fmt: skip
            self.interval = new
            if self._on_change is not None and (
                self._reported is None or abs(new - self._reported) > 0.1 * self._reported
            ):
                self._reported = new
                self._on_change(new, why, stall, persist)


class StepSchedule:
    """Turns a time-based policy into step numbers, so ranks agree on when to save without a collective per step.

    Every rank must save at the same step, but each rank's clock says something slightly different. Instead of
    asking rank 0 at every step, the ranks ask it only at *decision steps*: there rank 0 says whether the *next*
    step is saved and, from the step time it measured since the previous decision, at which step to decide
    next (one step before the one at which the interval will have passed). The answer travels while the next
    step trains (a non-blocking broadcast, read at that step), so no rank waits for the others at a decision:
    a blocking one would make each rank wait for the slowest at every decision. One broadcast per
    decision: about one per save, plus one per step while the step time is first being measured.
    ``decide`` runs on rank 0 only; the other ranks just keep ``next_decision``.

    Args:
        policy: a time-based policy (``EveryInterval`` or ``AutoInterval``): its ``interval`` and last save time.
        nearest: save at the step whose end is nearest to the interval's end, not the first step after it
            (the memory tier: its interval is a few steps, and rounding up would add half a step to every
            interval, and to the work every failure loses).
    """

    def __init__(self, policy: EveryInterval, *, nearest: bool = False) -> None:
        self.policy = policy
        self.nearest = nearest
        self.next_decision: int | None = None  # None: decide at the next step asked about
        self.decisions = 0
        self.in_flight: tuple[int, Any, Any] | None = None  # (step it is for, work, answer) of the broadcast
        self._mark: tuple[int, float] | None = None
        self._per_step: float | None = None

    def pending(self, step: int) -> bool:
        """Whether ``step`` is before the next decision step (then nothing is asked at it)."""
        return self.next_decision is not None and step < self.next_decision

    def decide(self, step: int, now: float) -> tuple[bool, int]:
        """(save ``step``?, the next decision step), asked one step before ``step`` at ``now`` (rank 0)."""
        if self._mark is not None and step > self._mark[0]:
            self._per_step = (now - self._mark[1]) / (step - self._mark[0])
        self._mark = (step, now)
        per_step = self._per_step
        at = now + (per_step or 0.0)  # when ``step`` ends, about
        slack = per_step / 2 if self.nearest and per_step is not None else 0.0
        due = self.policy.due_within(step, at, slack)
        last = self.policy.last_time
        remaining = self.policy.interval if due or last is None else self.policy.interval - (at - last)
        # while the step time is not known yet, decide again at the next step
        if per_step is None or per_step <= 0:
            return due, step
        steps = remaining / per_step
        return due, step + max(1, round(steps) if self.nearest else math.ceil(steps)) - 1

    def agreed(self, next_decision: int) -> None:
        """Every rank records the next decision step rank 0 chose."""
        self.next_decision = next_decision
        self.decisions += 1

    def reset(self) -> None:
        """Forget the schedule (after a restore): decide at the next step asked about."""
        self.next_decision = None
        self.in_flight = None
        self._mark = None
        self._per_step = None


def interval_events(emit: Callable[..., None], **fields: Any) -> Callable[[float, str, float, float], None]:
    """An ``on_change`` for :func:`tier_policy`: each new interval becomes a ``checkpoint_interval`` event (with
    ``fields``, such as the tier's name)."""
    return lambda interval, why, stall, persist: emit(
        "checkpoint_interval",
        interval_seconds=interval,
        reason=why,
        stall_seconds=stall,
        persist_seconds=persist,
        **fields,
    )


def tier_policy(
    config: CheckpointConfig,
    every_steps: int | None,
    every_seconds: float | None,
    *,
    world_size: int,
    on_change: Callable[[float, str, float, float], None],
) -> SavePolicy:
    """A tier's save policy: every ``every_steps`` steps, every ``every_seconds`` seconds, or else ``auto``
    (from ``config``'s prior failure rate for ``world_size`` ranks and its cost settings; ``on_change`` hears
    each new interval, why, and the stall and persist times it was planned with)."""
    if every_steps is not None:
        return EverySteps(every_steps)
    if every_seconds is not None:
        return EveryInterval(every_seconds)
    return AutoInterval(
        mtbf=config.prior_mtbf(world_size),
        max_interval=config.seconds("max_interval"),
        restart=config.seconds("restart"),
        detect=config.seconds("detect"),
        on_change=on_change,
    )
