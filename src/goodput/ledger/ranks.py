"""Every rank's ledger merged into one account: each job event counted once (internal to the accounting).

The time axis is one rank's (the *primary*, rank 0 unless asked otherwise): its steps, saves and restores
tile the wall time, since in a synchronous job every rank waits for the slowest at each collective. What
other ranks saw that the primary did not is added to it, once per job event:

- ``failure_detected``: one failure per attempt. When the primary declared none (a hang detected by rank 1's
  watchdog, while rank 0 waited in a collective), the lowest such rank's declaration is added at its time,
  so the attempt counts as failed and the silence as ``failure_detection``.
- custom events (``fault_injected``, ``checkpoint_failed``, ``eval``, ...): within one attempt, events with
  the same name and the same identifying fields (every field that is not a float: ``step``, ``action``,
  ``where``, ...) are one job event seen by several ranks; the job saw as many of them as the rank that saw
  the most.
- ``cache_stats`` and ``cache_config``: per rank by nature (each node's first rank records its node's cache),
  so every rank's are kept, with their ``rank``.
- ``shrink`` and ``grow``: one per generation of the run (every rank of the generation records it, a newcomer
  in an attempt of its own numbering), whichever attempt it is matched to.

Attempts of different ranks are matched by start time (every rank of an attempt starts together under
torchrun, while attempts are seconds apart), and an event's time is carried over through its wall clock.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from goodput.ledger.spans import BUILT_IN, RESHAPES, begin_wall, split_attempts

_META = frozenset({"event", "wall", "mono", "attempt", "rank"})
_PER_RANK = frozenset({"cache_stats", "cache_config"})
_DECLARATIONS = frozenset({"checkpoint_config", "state_registered", "checkpoint_interval"})


def merge_ranks(
    events: Iterable[Mapping[str, Any]], *, primary: int | None = None
) -> list[Mapping[str, Any]]:
    """The primary rank's events plus what only other ranks saw, each job event once.

    Args:
        events: ledger events of one or more ranks (every attempt), as :func:`read_events` returns them.
        primary: whose time axis to use; None (or a rank without an attempt) is the lowest rank with one.

    Returns:
        One rank's worth of events, ready for :func:`goodput.ledger.accounting.account`.
    """
    by_rank: dict[int, list[Mapping[str, Any]]] = {}
    for event in events:
        by_rank.setdefault(int(event.get("rank", 0) or 0), []).append(event)
    if not by_rank:
        return []
    started = [r for r, evs in by_rank.items() if any(e.get("event") == "attempt_start" for e in evs)]
    chosen = primary if primary in started else min(started, default=min(by_rank))
    own = split_attempts(by_rank.pop(chosen))
    if not by_rank or not own:
        return [e for group in own for e in group]
    added: list[list[Mapping[str, Any]]] = [[] for _ in own]
    seen = [_tally(group) for group in own]
    generations = {_generation(e) for group in own for e in group} - {None}
    begins = [begin_wall(group[0]) for group in own]  # in order: split_attempts sorts by it
    for rank in sorted(by_rank):
        # only the attempt starts and what may count: the grouping is the same, with fewer events to sort
        kept = (e for e in by_rank[rank] if e.get("event") == "attempt_start" or _counted(e))
        for group in split_attempts(kept):
            counted = group[1:]
            if counted:
                i = _nearest(begins, begin_wall(group[0]))
                fresh = [e for e in counted if _generation(e) is None or _generation(e) not in generations]
                generations |= {_generation(e) for e in fresh} - {None}
                added[i].extend(_new_job_events(own[i], group[0], fresh, seen[i]))
    return [e for group, extra in zip(own, added, strict=True) for e in (*group, *extra)]


def _nearest(begins: list[float], start: float) -> int:
    """The attempt whose begin is nearest ``start`` (the earlier on a tie), of ``begins`` in order."""
    i = bisect.bisect_left(begins, start)
    if i == len(begins) or (i > 0 and start - begins[i - 1] <= begins[i] - start):
        return i - 1
    return i


def _generation(event: Mapping[str, Any]) -> tuple[Any, Any] | None:
    """A shrink's or grow's job-wide identity, (name, generation); None for any other event."""
    if event.get("event") in RESHAPES and event.get("generation") is not None:
        return event["event"], event["generation"]
    return None


def _key(event: Mapping[str, Any]) -> tuple[Any, ...]:
    name = event.get("event")
    if name == "failure_detected":
        return (name,)
    fields = sorted((k, repr(v)) for k, v in event.items() if k not in _META and not isinstance(v, float))
    return (name, *fields)


def _counted(event: Mapping[str, Any]) -> bool:
    name = event.get("event")
    if name == "failure_detected":
        return True
    return name not in BUILT_IN and name not in _DECLARATIONS


def _tally(group: list[Mapping[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(_key(e) for e in group if _counted(e) and e.get("event") not in _PER_RANK)


def _new_job_events(
    own: list[Mapping[str, Any]],
    other_head: Mapping[str, Any],
    counted: list[Mapping[str, Any]],
    seen: Counter[tuple[Any, ...]],
) -> list[Mapping[str, Any]]:
    """The ``counted`` events of one attempt of another rank (whose ``attempt_start`` is ``other_head``, in
    time order) that the job has not yet counted, on ``own``'s clock; ``seen`` (the counts so far in this
    attempt) is updated."""
    head = own[0]
    offset = float(head["mono"]) - float(head["wall"])
    other_wall, other_mono = float(other_head["wall"]), float(other_head["mono"])
    keys = [None if e.get("event") in _PER_RANK else _key(e) for e in counted]
    mine = Counter(key for key in keys if key is not None)
    out: list[Mapping[str, Any]] = []
    for event, key in zip(counted, keys, strict=True):
        if key is not None:
            if seen[key] >= mine[key]:
                continue
            seen[key] += 1
        wall = other_wall + float(event["mono"]) - other_mono
        out.append({**event, "wall": wall, "mono": wall + offset, "attempt": head.get("attempt")})
    return out
