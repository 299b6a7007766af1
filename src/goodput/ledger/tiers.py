"""Restores by checkpoint tier: how many came from memory, a peer node's replica or the durable tier, how
long each took, and the steps each failure lost (redone after it).

Reads the ``checkpoint_restored`` events the checkpoint manager records (``tier``: ``memory``, ``peer`` or
``durable``; ``seconds``; ``step``) and, for lost work, the newest step the restoring rank's attempt before
finished, less the step restored (the most of any rank of the restore).
A warm restart's live recovery (the replacement rank takes the state from a surviving replica, no checkpoint
read: ``warm_restart`` events with a ``restored_step``) counts as a restore from ``replica``, once per
generation, taking the slowest rank's ``restore_seconds``; a generation that shrank or grew in place restored
nothing (the survivors kept their state) and is no restore. Likewise every rank records its own
``checkpoint_restored``: one attempt's restore counts once, with its slowest rank's seconds and the farthest
tier any rank read from (``durable`` over ``peer`` over ``memory``), so a 2-rank job's one restore is not two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["live_recovered_share", "restores_by_tier"]

_FARTHEST = {"memory": 0, "peer": 1, "durable": 2}  # an attempt's ranks may read different tiers: the slowest


def restores_by_tier(events: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per tier: ``count``, ``seconds_mean`` and ``lost_steps_mean`` (steps redone per failure; restores of an
    attempt whose predecessor finished no step are not counted there). Empty when no restore was recorded."""
    events = list(events)
    resized = {e.get("generation") for e in events if e.get("event") in ("shrink", "grow")} - {None}
    last_step: dict[tuple[int, int], int] = {}  # (rank, attempt) -> the newest step it finished
    restored: dict[int, tuple[str, float, int | None]] = {}  # attempt -> (tier, slowest seconds, steps lost)
    live: dict[int, tuple[float, int | None]] = {}  # generation -> (slowest seconds, steps lost)
    for e in events:
        if e.get("event") == "step_end" and e.get("step") is not None:
            key = (int(e.get("rank", 0) or 0), int(e.get("attempt", 0)))
            last_step[key] = max(last_step.get(key, 0), int(e["step"]))
    for e in events:
        attempt, rank = int(e.get("attempt", 0)), int(e.get("rank", 0) or 0)
        before = last_step.get((rank, attempt - 1))
        if e.get("event") == "checkpoint_restored":
            tier, seconds, step = str(e.get("tier")), float(e.get("seconds") or 0.0), int(e.get("step") or 0)
            seen = restored.get(attempt)
            if seen is not None and _FARTHEST.get(seen[0], 3) > _FARTHEST.get(tier, 3):
                tier = seen[0]
            lost = _most(None if before is None else before - step, seen[2] if seen else None)
            restored[attempt] = (tier, max(seconds, seen[1] if seen else 0.0), lost)
        elif e.get("event") == "warm_restart" and e.get("restored_step") is not None:
            generation = int(e.get("generation", attempt))
            if generation in resized:  # the survivors trained on (or took a newcomer): nothing restored
                continue
            known = live.get(generation, (0.0, None))
            lost = _most(None if before is None else before - int(e["restored_step"]), known[1])
            live[generation] = (max(float(e.get("restore_seconds") or 0.0), known[0]), lost)
    rows = list(restored.values()) + [("replica", seconds, lost) for seconds, lost in live.values()]
    out: dict[str, dict[str, float]] = {}
    for tier in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == tier]
        steps = [max(0, r[2]) for r in mine if r[2] is not None]
        out[tier] = {
            "count": float(len(mine)),
            "seconds_mean": sum(r[1] for r in mine) / len(mine),
            "lost_steps_mean": sum(steps) / len(steps) if steps else 0.0,
        }
    return out


def _most(a: int | None, b: int | None) -> int | None:
    """The larger of two step counts, either unknown (None)."""
    return b if a is None else a if b is None else max(a, b)


def live_recovered_share(events: Iterable[Mapping[str, Any]], failures: int) -> float:
    """The share of failures recovered with no checkpoint read (a warm restart's replacement took a surviving
    replica's state, or the survivors shrank in place and kept theirs), counted as if one more failure had
    not been: 0 before any, then 1/2, 2/3, ... while every one is. The memory tier's ``auto`` interval plans
    only for the rest."""
    events = list(events)
    shrinks = {e.get("generation") for e in events if e.get("event") == "shrink"} - {None}
    live = restores_by_tier(events).get("replica", {}).get("count", 0.0) + len(shrinks)
    return min(live, failures) / (failures + 1)
