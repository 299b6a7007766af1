"""Restores by checkpoint tier: how many came from memory, a peer node's replica or the durable tier, how
long each took, and the steps each failure lost (redone after it).

Reads the ``checkpoint_restored`` events the checkpoint manager records (``tier``: ``memory``, ``peer`` or
``durable``; ``seconds``; ``step``) and, for lost work, the newest step the attempt before each restore finished.
A warm restart's live recovery (the replacement rank takes the state from a surviving replica, no checkpoint
read: ``warm_restart`` events with a ``restored_step``) counts as a restore from ``replica``, once per
generation, taking the slowest rank's ``restore_seconds``. Likewise every rank records its own
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
    last_step: dict[int, int] = {}
    restored: dict[int, tuple[str, float, int]] = {}  # attempt -> (tier, slowest rank's seconds, step)
    live: dict[int, tuple[int, float, int]] = {}  # generation -> (attempt, seconds, step)
    for e in events:
        attempt = int(e.get("attempt", 0))
        if e.get("event") == "step_end" and e.get("step") is not None:
            last_step[attempt] = max(last_step.get(attempt, 0), int(e["step"]))
        elif e.get("event") == "checkpoint_restored":
            tier, seconds, step = str(e.get("tier")), float(e.get("seconds") or 0.0), int(e.get("step") or 0)
            seen = restored.get(attempt)
            if seen is not None:
                seconds = max(seconds, seen[1])
                if _FARTHEST.get(seen[0], 3) > _FARTHEST.get(tier, 3):
                    tier = seen[0]
            restored[attempt] = (tier, seconds, step)
        elif e.get("event") == "warm_restart" and e.get("restored_step") is not None:
            key = int(e.get("generation", attempt))
            seconds = float(e.get("restore_seconds") or 0.0)
            known = live.get(key)
            live[key] = (attempt, max(seconds, known[1] if known else 0.0), int(e["restored_step"]))
    restores = [(a, tier, seconds, step) for a, (tier, seconds, step) in restored.items()]
    restores += [(a, "replica", seconds, step) for a, seconds, step in live.values()]
    out: dict[str, dict[str, float]] = {}
    for tier in sorted({r[1] for r in restores}):
        rows = [r for r in restores if r[1] == tier]
        lost = [last_step[a - 1] - step for a, _, _, step in rows if a - 1 in last_step]
        out[tier] = {
            "count": float(len(rows)),
            "seconds_mean": sum(r[2] for r in rows) / len(rows),
            "lost_steps_mean": sum(lost) / len(lost) if lost else 0.0,
        }
    return out


def live_recovered_share(events: Iterable[Mapping[str, Any]], failures: int) -> float:
    """The share of failures a warm restart recovered live (from a surviving replica, no checkpoint read),
    counted as if one more failure had not been: 0 before any, then 1/2, 2/3, ... while every one is live.
    The memory tier's ``auto`` interval plans only for the rest."""
    live = restores_by_tier(events).get("replica", {}).get("count", 0.0)
    return min(live, failures) / (failures + 1)
