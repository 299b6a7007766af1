"""Ledger events of one rank paired into spans on one time axis (internal to :mod:`goodput.ledger.accounting`).

Each attempt's monotonic times are anchored at its ``attempt_start`` wall time; attempts are laid end to end
in wall-clock order. Steps, stalls, restores and failure detections become (start, end) spans; outcomes and
the last kept step of each failed attempt are derived from the next attempt's restore, and consecutive attempts
are told apart as a restart within one launch or a new launch (:func:`new_launch`).

An attempt's steps come as events or, read from its step-record file (:mod:`goodput.ledger.steps`), as an array:
then they are paired as arrays and never become events, which is what keeps a long run's report fast. An attempt
that shrank or grew in place, or whose records hold a step ended without a start, has its records turned into
events, so each is paired exactly as its events would be.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from goodput.ledger.steps import records_to_events


class StepArrays(NamedTuple):
    """An attempt's completed steps, in the order they ended: start, end, fetch (clipped to the step) on the
    run's time axis, and the step number (NaN where a step_end named none)."""

    start: np.ndarray
    end: np.ndarray
    fetch: np.ndarray
    number: np.ndarray


class Attempt:
    """Events of one attempt on the run's time axis: seconds since the run's origin (internal).

    Times are kept relative to the first attempt's process start so that differences of a few milliseconds
    keep their precision (absolute wall times near 1.8e9 s carry only ~0.2 us).
    """

    def __init__(
        self,
        number: int,
        events: list[Mapping[str, Any]],
        shift_from: float,
        origin: float,
        records: np.ndarray | None = None,
    ) -> None:
        head = events[0]
        if records is not None and not _pairable(records, events):
            steps = records_to_events(records, int(head.get("attempt", number)), int(head.get("rank", 0)))
            events = [head, *sorted([*events[1:], *steps], key=_time_order)]
            records = None
        origin_wall, origin_mono = float(head["wall"]), float(head["mono"])
        anchor = origin_wall - origin
        begin = min(begin_wall(head), origin_wall) - origin
        shift = max(0.0, shift_from - begin)
        self.number = number
        self.begin = begin + shift
        self.times = [anchor + shift + (float(e["mono"]) - origin_mono) for e in events]
        self.events = events
        self.end = max(self.times)
        self.records: tuple[np.ndarray, np.ndarray, np.ndarray] | None = (
            None  # start, end (NaN: open), record
        )
        if records is not None and len(records):
            zero = anchor + shift
            starts, ends = zero + (records["start"] - origin_mono), zero + (records["end"] - origin_mono)
            self.records = (starts, ends, records)
            self.end = max(self.end, float(starts.max()), float(np.nanmax(ends, initial=-math.inf)))
        self.launch = head.get("launch")  # goodput launch's id, when the attempt ran under one
        self.restart_count = head.get("restart_count")  # torchrun's, which a new torchrun starts at 0
        # a warm restart's attempt, a rollback in place (goodput.run.numeric), or a shrink or grow in place:
        # the same processes go on
        self.warm = any(e.get("event") in ("warm_restart", "rollback", *RESHAPES) for e in events)
        self.world = int(head.get("world_size") or 1)
        self.reserved = max(self.world, int(head.get("reserved_world") or self.world))


# The group went on at another size with no process restarted (goodput.warm): a rank lost, or one taken back.
RESHAPES = ("shrink", "grow")


def _pairable(records: np.ndarray, events: list[Mapping[str, Any]]) -> bool:
    """Whether the records can be paired as arrays: every ended step has its start, and no shrink or grow
    (which interrupts the open step) lies among them."""
    ended = records["end"] == records["end"]
    return not np.isnan(records["start"][ended]).any() and not any(e.get("event") in RESHAPES for e in events)


def begin_wall(head: Mapping[str, Any]) -> float:
    """Wall time an attempt began: its process start when recorded, else its attempt_start."""
    return float(head.get("process_start", head["wall"]))


BUILT_IN = frozenset(
    {
        "attempt_start",
        "init_done",
        "restore_start",
        "restore_end",
        "step_start",
        "step_end",
        "checkpoint_stall_start",
        "checkpoint_stall_end",
        "checkpoint_durable",
        "failure_detected",
        "attempt_end",
    }
)


def canonical_name(event: Mapping[str, Any]) -> str:
    """The event's name, with the checkpoint manager's ``checkpoint_stall`` + ``phase`` spelled out."""
    name = str(event.get("event", ""))
    if name == "checkpoint_stall" and event.get("phase") in ("start", "end"):
        return f"checkpoint_stall_{event['phase']}"
    return name


def _time_order(event: Mapping[str, Any]) -> tuple[float, int]:
    """Sort key: monotonic time; at equal times spans close before new ones open."""
    name = canonical_name(event)
    return float(event["mono"]), (0 if name.endswith(("_end", "_durable")) else 1)


def split_attempts(events: Iterable[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Events grouped by their ``attempt`` field (file order where it is missing or reused), by time."""
    by_number: dict[Any, list[Mapping[str, Any]]] = {}
    for event in events:
        by_number.setdefault(event.get("attempt"), []).append(event)
    groups: list[list[Mapping[str, Any]]] = []
    for bucket in by_number.values():
        heads = [i for i, e in enumerate(bucket) if e.get("event") == "attempt_start"]
        if len(heads) == 1:
            groups.append([bucket[heads[0]], *bucket[: heads[0]], *bucket[heads[0] + 1 :]])
            continue
        for event in bucket:  # no number, or a number written by two processes: split in file order
            if event.get("event") == "attempt_start":
                groups.append([event])
            elif groups and groups[-1][0].get("attempt") == event.get("attempt"):
                groups[-1].append(event)
    for group in groups:
        if len(group) > 2:
            group[1:] = sorted(group[1:], key=_time_order)
    groups.sort(key=lambda g: begin_wall(g[0]))
    return groups


def layout(
    events: Iterable[Mapping[str, Any]], records: Mapping[tuple[int, int], np.ndarray] | None = None
) -> tuple[list[Attempt], float]:
    """The attempts on one time axis, and its origin (wall time of the first attempt's start); ``records``:
    step records by (attempt, rank), for the attempts whose steps are not among the events."""
    groups = split_attempts(events)
    if not groups:
        return [], 0.0
    origin = min(begin_wall(groups[0][0]), float(groups[0][0]["wall"]))
    attempts: list[Attempt] = []
    previous_end = -math.inf
    for i, group in enumerate(groups):
        head = group[0]
        mine = (records or {}).get((int(head.get("attempt", -1)), int(head.get("rank", 0) or 0)))
        attempt = Attempt(int(head.get("attempt", i)), group, previous_end, origin, mine)
        attempts.append(attempt)
        previous_end = attempt.end
    return attempts, origin


class Spans:
    """Paired spans of one attempt: steps, stalls, restores, failure detection (internal)."""

    def __init__(self, a: Attempt) -> None:
        self._steps: list[tuple[float, float, float, float]] = []  # start, end, fetch, step (NaN: none)
        self.open_step: tuple[float, int | None] | None = None
        self.restores: list[tuple[float, float]] = []
        self.restored_step: int | None = None
        self.has_restore = False
        # [step, start, stall_end, durable, has_stall, waited (of the stall, for the save in flight)]
        self.saves: list[list[Any]] = []
        # memory-tier saves: stall time, but not durable saves (C, W and the interval are the durable tier's)
        self.memory_stalls: list[tuple[float, float]] = []
        self._memory_open: float | None = None
        # the pauses before a refused final save is tried again (``retry``): stall time, not saves
        self.retry_pauses: list[tuple[float, float]] = []
        self._pause_open: float | None = None
        self.durable: list[tuple[float, int]] = []
        self.detect: list[tuple[float, float]] = []
        self.status: str | None = None
        self.preempted = False
        self.failure_reason: str | None = None
        self.info: list[Mapping[str, Any]] = []
        # shrinks and grows: (time, event); a shrink's interrupted step: (step start, failure detected)
        self.reshapes: list[tuple[float, Mapping[str, Any]]] = []
        self.interrupted: list[tuple[float, float]] = []
        self._first_step_start = math.inf
        self._last_step_start = -math.inf
        self._step_starts: list[float] = []
        self._record_times = _RecordTimes(a)
        self._read(a)
        if a.records is not None:
            self.steps, self._starts = self._record_times.finish(self, a.records)
        else:
            self.steps, self._starts = _arrays(self._steps), np.asarray(self._step_starts, dtype=float)

    def _read(self, a: Attempt) -> None:
        restore_open: float | None = None
        last_event_t = a.begin
        for event, t in zip(a.events, a.times, strict=True):
            name = canonical_name(event)
            step = event.get("step")
            if name == "step_start":
                self.open_step = (t, step)
                self._first_step_start = min(self._first_step_start, t)
                self._last_step_start = t
                self._step_starts.append(t)
            elif name == "step_end":
                self._close_step(t, event)
            elif name == "restore_start":
                restore_open = t
                self.has_restore = True
            elif name == "restore_end":
                self.has_restore = True
                self.restores.append((a.begin if restore_open is None else restore_open, t))
                restore_open = None
                self.restored_step = None if step is None else int(step)
            elif name == "checkpoint_stall_start" and event.get("tier") == "memory":
                self._memory_open = t
            elif name == "checkpoint_stall_end" and event.get("tier") == "memory":
                if self._memory_open is not None:
                    self.memory_stalls.append((self._memory_open, t))
                self._memory_open = None
            elif name == "checkpoint_stall_start" and event.get("retry") is not None:
                self._pause_open = t
            elif name == "checkpoint_stall_end" and event.get("retry") is not None:
                if self._pause_open is not None:
                    self.retry_pauses.append((self._pause_open, t))
                self._pause_open = None
            elif name == "checkpoint_stall_start":
                self.saves.append([step, t, None, None, True, None])
            elif name == "checkpoint_stall_end":
                if (save := self._match_save(step, t, 2)) is not None and "waited" in event:
                    save[5] = float(event["waited"])
            elif name == "checkpoint_durable":
                self._last_step_start = max(self._last_step_start, self._record_times.last_start(t))
                self._durable(event, t)
            elif name == "failure_detected":
                silent = event.get("silent_seconds")
                last_event_t = max(last_event_t, self._record_times.last_event(t))
                start = last_event_t if silent is None else max(a.begin, t - float(silent))
                self.detect.append((start, t))
                self.failure_reason = str(event.get("reason", "failure detected"))
            elif name == "attempt_end":
                self.status = str(event.get("status", "ok"))
            elif name in RESHAPES:
                self._reshape(t, event)
            elif name == "checkpoint_failed":
                self._failed(step, t)
                self.info.append(event)  # tallied as a custom event too
            elif name not in BUILT_IN:  # declarations and custom events, kept for the report
                self.info.append(event)
                self.preempted = self.preempted or name == "preempted"
            last_event_t = t
        if restore_open is not None:
            self.restores.append((restore_open, a.end))

    def _reshape(self, t: float, event: Mapping[str, Any]) -> None:
        """A shrink or grow at ``t`` (training resumed at the new size); a step open at a shrink was
        interrupted by the failure, ``seconds`` (failure detected to resumed) before ``t``."""
        self.reshapes.append((t, event))
        if event.get("event") == "shrink" and self.open_step is not None:
            detected = t - max(0.0, float(event.get("seconds") or 0.0))
            self.interrupted.append((self.open_step[0], max(self.open_step[0], detected)))
            self.open_step = None

    def resumed(self, t: float, end: float) -> float:
        """When training resumed after ``t``: the next step's start (``end`` when none started)."""
        i = int(np.searchsorted(self._starts, t, side="left"))
        return float(self._starts[i]) if i < len(self._starts) else end

    def in_place_failures(self) -> int:
        """Shrinks after this attempt began training: failures its own outcome does not count (a shrink
        that opens an attempt follows the failed one before it, which counts)."""
        first = self._first_step_start
        return sum(1 for t, e in self.reshapes if e.get("event") == "shrink" and t > first)

    def reshaped_start(self, kind: str | None = None) -> bool:
        """Whether this attempt began with a shrink or grow (``kind``: that one only): the group went on in
        place, no restart."""
        return any(t <= self._first_step_start and kind in (None, e.get("event")) for t, e in self.reshapes)

    def _close_step(self, t: float, event: Mapping[str, Any]) -> None:
        fetch = float(event.get("fetch_seconds") or 0.0)
        step = event.get("step")
        if self.open_step is not None:
            start = self.open_step[0]
        elif event.get("seconds") is not None:
            start = t - float(event["seconds"])
        else:
            return
        self.open_step = None
        self._steps.append(
            (start, t, min(max(fetch, 0.0), t - start), math.nan if step is None else int(step))
        )

    def _match_save(self, step: Any, t: float, slot: int) -> list[Any] | None:
        for save in reversed(self.saves):
            if save[slot] is None and save[4] and (step is None or save[0] is None or save[0] == step):
                save[slot] = t
                return save
        return None

    def _durable(self, event: Mapping[str, Any], t: float) -> None:
        step = event.get("step")
        save = self._match_save(step, t, 3)
        if save is None:
            seconds = event.get("persist_seconds", event.get("seconds"))
            start = t - float(seconds) if seconds is not None else t
            self.saves.append([step, start, None, t, False, None])
        elif save[2] is not None and self._last_step_start < save[2]:
            save[2] = t  # no step ran between the stall's end and durable: training was blocked till now
        if step is not None:
            self.durable.append((t, int(step)))

    def _failed(self, step: Any, t: float) -> None:
        """A save failed at ``t``: when no step ran since its stall ended (the run's end waiting for its final
        save), training was blocked until the failure, as it is until a durable one's commit."""
        self._last_step_start = max(self._last_step_start, self._record_times.last_start(t))
        for save in reversed(self.saves):
            if save[4] and save[3] is None and (step is None or save[0] is None or save[0] == step):
                if save[2] is not None and self._last_step_start < save[2] < t:
                    save[2] = t
                return


def _arrays(steps: list[tuple[float, float, float, float]]) -> StepArrays:
    table = np.asarray(steps, dtype=float).reshape(-1, 4)
    return StepArrays(table[:, 0], table[:, 1], table[:, 2], table[:, 3])


class _RecordTimes:
    """An attempt's step records as its other events see them: the last step start or event before a time,
    and, once those are read, the steps and the open one (internal to :class:`Spans`)."""

    def __init__(self, a: Attempt) -> None:
        if a.records is None:
            self._starts = self._ends = np.empty(0)
            return
        starts, ends, _ = a.records
        self._starts = np.sort(starts)
        self._ends = np.sort(ends[ends == ends])

    def last_start(self, t: float) -> float:
        """The last step start before ``t`` (a save's end at the same instant comes first)."""
        i = int(np.searchsorted(self._starts, t, side="left"))
        return float(self._starts[i - 1]) if i else -math.inf

    def last_event(self, t: float) -> float:
        """The last step start or end at or before ``t``."""
        i = int(np.searchsorted(self._starts, t, side="left"))
        j = int(np.searchsorted(self._ends, t, side="right"))
        return max(
            float(self._starts[i - 1]) if i else -math.inf, float(self._ends[j - 1]) if j else -math.inf
        )

    def finish(
        self, s: Spans, records: tuple[np.ndarray, np.ndarray, np.ndarray]
    ) -> tuple[StepArrays, np.ndarray]:
        """The completed steps, and every step start in order; sets the spans' open step and first and last
        step start, as reading the records' events would."""
        starts, ends, raw = records
        ended = ends == ends
        last = int(np.argmax(starts))
        if not ended[last]:
            s.open_step = (float(starts[last]), int(raw["step"][last]))
        s._first_step_start = min(s._first_step_start, float(self._starts[0]))
        s._last_step_start = max(s._last_step_start, float(self._starts[-1]))
        order = np.argsort(ends[ended], kind="stable")
        start, end = starts[ended][order], ends[ended][order]
        fetch = np.minimum(np.maximum(raw["fetch"][ended][order], 0.0), end - start)
        return StepArrays(start, end, fetch, raw["step"][ended][order].astype(float)), self._starts


def kept_steps(
    spans: list[Spans], attempts: list[Attempt], outcomes: list[str]
) -> list[tuple[int | None, bool]]:
    """Per attempt: (last kept step, whether steps above it are lost) for lost-work accounting.

    The next attempt's restored step decides when it is known (its steps above were redone, whatever this
    attempt's outcome); one that began with a shrink or grow in place kept every step; a failed attempt
    without either falls back to the newest durable checkpoint so far.
    """
    result: list[tuple[int | None, bool]] = []
    durable_so_far: list[tuple[float, int]] = []
    for i, (s, a) in enumerate(zip(spans, attempts, strict=True)):
        durable_so_far.extend(d for d in s.durable if d[0] <= a.end)
        nxt = spans[i + 1] if i + 1 < len(spans) else None
        if nxt is not None and nxt.has_restore:
            result.append((nxt.restored_step, True))
        elif nxt is not None and nxt.reshaped_start():
            result.append((None, False))  # the survivors went on in place with the state they had
        elif outcomes[i] == "failed":
            result.append((max((step for _, step in durable_so_far), default=None), True))
        else:
            result.append((None, False))  # ended cleanly or still running: every step counts
    return result


def outcome(i: int, n: int, s: Spans) -> str:
    """ "ok", "failed", "preempted" or "running" (the last attempt, no end recorded).

    A process that exited without closing its ledger ("exited") failed if another attempt followed it. An
    attempt stopped by a preemption signal (Ctrl-C, SIGTERM, the preempt signal: it records ``preempted``
    and ends "interrupted") was asked to stop: not a failure, whatever rank saw the signal first.
    """
    if s.preempted or s.status == "interrupted":
        return "preempted"
    if s.status == "exited" and not s.detect:
        return "failed" if i < n - 1 else "ok"
    if s.status is not None:
        return "ok" if s.status == "ok" and not s.detect else "failed"
    if s.detect or i < n - 1:
        return "failed"
    return "running"


def new_launch(previous: Attempt, attempt: Attempt) -> bool:
    """Whether ``attempt`` began a new launch (the job was started again) rather than restarting within one.

    Attempts under ``goodput launch`` record its launch id: a different id is a new launch. Without one, a
    torchrun restart count back at 0 is a new torchrun (a warm restart's or a rollback's attempt keeps the
    count, and says ``warm_restart`` or ``rollback``); a ledger that records neither is one launch.
    """
    if previous.launch is not None and attempt.launch is not None:
        return bool(previous.launch != attempt.launch)
    return attempt.restart_count == 0 and not attempt.warm
