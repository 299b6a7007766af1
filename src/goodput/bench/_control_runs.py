"""What one run of ``goodput bench control`` cost the control plane, read from the files the run wrote.

Every figure comes from the run's own records: the workers' ledgers (``attempt_start``, ``step_end``,
``fault_injected``, ``warm_restart`` with its parts and ``store_ops``) and the agent's log
(``RUN_DIR/warm/agent.jsonl``: ``warm_restart``/``shrink``/``grow`` and ``warm_restart_done``, each with the
agent's ``store_ops`` so far), and the machine's CPU samples the bench took while the run ran. Pure reading: no
clock, no process.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["agent_events", "busy_share", "failure_ops", "handover", "memory_used", "rendezvous"]

PARTS = ("detection_seconds", "left_seconds", "handover_seconds", "reform_seconds", "restore_seconds")


def agent_events(run_dir: str) -> list[dict[str, Any]]:
    """The agent's log, one dict a line (empty when the run wrote none)."""
    path = os.path.join(run_dir, "warm", "agent.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rendezvous(events: list[dict[str, Any]], launched_wall: float) -> dict[str, float | None]:
    """The first generation's start: from the launch to every rank's first step, and the part of it after the
    last rank began its first attempt (its imports, the store's arrival count and the group's init done)."""
    first = [e for e in events if e.get("attempt") == 0]
    starts = [e["wall"] for e in first if e["event"] == "attempt_start"]
    steps: dict[int, float] = {}
    for e in first:
        if e["event"] == "step_end":
            steps[e["rank"]] = min(steps.get(e["rank"], e["wall"]), e["wall"])
    if not starts or not steps:
        return {"start_to_first_step_seconds": None, "last_join_to_first_step_seconds": None}
    last_step = max(steps.values())
    return {
        "start_to_first_step_seconds": last_step - launched_wall,
        "last_join_to_first_step_seconds": last_step - max(starts),
    }


def handover(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The parts of the first live recovery of ``kind`` ("warm", "shrink" or "grow") over its ranks: the
    mean and the slowest rank's of each part, and the failure (or the grow's hand-over) to the first step every
    rank completed after it."""
    gens = sorted({e["generation"] for e in events if e["event"] == "warm_restart" and e.get("kind") == kind})
    if not gens:
        return {"ranks": 0}
    rows = [e for e in events if e["event"] == "warm_restart" and e.get("generation") == gens[0]]
    out: dict[str, Any] = {"ranks": len(rows), "generation": gens[0]}
    for part in PARTS:
        values = [float(e[part]) for e in rows if isinstance(e.get(part), int | float)]
        out[part] = sum(values) / len(values) if values else None
        out[f"max_{part}"] = max(values) if values else None
    recovered = max(e["wall"] for e in rows)
    firsts = [e["wall"] for e in events if e["event"] == "step_end" and e["wall"] > recovered]
    began = _began(events, rows)
    out["to_next_step_seconds"] = (min(firsts) - began) if firsts and began is not None else None
    out["began_wall"], out["next_step_wall"] = began, min(firsts) if firsts else None
    out["worker_store_ops"] = sum(_total(e.get("store_ops")) for e in rows)
    return out


def _began(events: list[dict[str, Any]], rows: list[dict[str, Any]]) -> float | None:
    """When the recovery began: the killed rank's ``fault_injected`` before it, else (a grow) the earliest
    moment a rank of it records (its detection, which a grow sets to the spare's readiness)."""
    recovered = min(e["wall"] for e in rows)
    faults = [e["wall"] for e in events if e["event"] == "fault_injected" and e["wall"] < recovered]
    if rows[0].get("kind") != "grow" and faults:
        return max(faults)
    starts = [
        e["wall"] - float(e.get("restore_seconds") or 0) - float(e.get("reform_seconds") or 0) for e in rows
    ]
    return min(starts) if starts else None


def failure_ops(agent: list[dict[str, Any]], kind: str) -> int | None:
    """The agent's store operations from its first ``kind`` decision (after the hand-over's own writes) to
    the recovery's confirmation (``warm_restart_done`` of the same generation)."""
    decision = next((e for e in agent if e["event"] == kind), None)
    if decision is None:
        return None
    done = next(
        (e for e in agent if e["event"] == "warm_restart_done" and e.get("gen") == decision.get("gen")), None
    )
    if done is None or "store_ops" not in done:
        return None
    return _total(done["store_ops"]) - _total(decision.get("store_ops"))


def _total(ops: dict[str, int] | None) -> int:
    return sum(ops.values()) if ops else 0


def memory_used(samples: list[int]) -> float | None:
    """GiB: the most memory in use while the run ran over the least (``/proc/meminfo`` samples of
    MemTotal - MemAvailable, in KiB)."""
    if len(samples) < 2:
        return None
    return (max(samples) - min(samples)) / (1 << 20)


def busy_share(cpu: list[tuple[float, int, int]], began: float | None, ended: float | None) -> float | None:
    """The share of the machine's CPU time (every core) that was busy from ``began`` to ``ended`` (wall times),
    from ``(wall, busy jiffies, total jiffies)`` samples: between the last sample at or before ``began`` and the
    first at or after ``ended`` (None: no such pair, or no time between them). Near 1: the recovery waited for
    cores, and its wall time measures how many processes share them. ``/proc/stat`` counts every CPU of the
    host: in a container held to fewer by a CPU quota, a saturated job shows a lower share."""
    if began is None or ended is None:
        return None
    before = [s for s in cpu if s[0] <= began]
    after = [s for s in cpu if s[0] >= ended]
    if not before or not after or after[0][2] <= before[-1][2]:
        return None
    return (after[0][1] - before[-1][1]) / (after[0][2] - before[-1][2])
