"""The ratios ``goodput bench peers`` reports, from its rows (pure functions).

Each run's wall time is divided by its own contender's fault-free wall time and by the baseline's under the same
schedule and seed; ``lost_per_failure`` is its wall time minus the fault-free one, over the failures it received.
``ledger_lost_per_failure`` is the same cost as the run's own ledger accounts it, within the one run: the time its
ledger puts in a failure's categories (detection, restart downtime, restore, rollback, reshape, lost work) plus the
start-up and warm-up beyond the fault-free run's, over the failures. It leaves out what the wall-time difference
also holds: how fast two runs taken minutes apart stepped, which drifts between runs on a shared machine.
A fault-free run repeated in rounds counts by the median of its rounds. A schedule run under several seeds
(``--seed 0,1,2``) is summed up seed by seed first, each contender against a peer that met the very same
failures, and then by the median of those ratios over the seeds; the per-seed ratios are listed beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["GOODPUT", "median_walls", "ratios", "summary"]

GOODPUT = ("cold", "memory", "warm", "shrink")  # the contenders goodput launch runs
_Key = tuple[str, str, int]  # (contender, schedule, seed)
_FAILURE = ("failure_detection", "restart_downtime", "checkpoint_restore", "rollback", "reshape", "lost_work")
_BEYOND_FREE = ("init", "warmup")  # a run pays these once without faults; a restart pays them again


def _key(row: dict[str, Any]) -> _Key:
    return row["contender"], row["schedule"], int(row.get("seed", 0))


def median_walls(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """Each (contender, schedule)'s wall time: the median over its rounds and seeds (one run: its own)."""
    walls: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.get("wall_seconds") is not None:
            walls.setdefault((r["contender"], r["schedule"]), []).append(r["wall_seconds"])
    return {key: statistics.median(values) for key, values in walls.items()}


def ratios(rows: list[dict[str, Any]]) -> None:
    """Set each run's ``over_fault_free``, ``over_baseline`` (the baseline under the same schedule and seed; the
    medians of the fault-free rounds) and ``lost_per_failure``."""
    free = median_walls(r for r in rows if r["schedule"] == "none")
    once = _fault_free_once(rows)
    runs = {_key(r): r["wall_seconds"] for r in rows if r.get("wall_seconds") is not None}
    for r in rows:
        if r.get("wall_seconds") is None:
            continue
        own = free.get((r["contender"], "none"))
        if r["schedule"] == "none":
            base = free.get(("baseline", "none"))
        else:
            base = runs.get(("baseline", r["schedule"], int(r.get("seed", 0))))
        r["over_fault_free"] = round(r["wall_seconds"] / own, 3) if own else None
        r["over_baseline"] = round(r["wall_seconds"] / base, 3) if base else None
        kills = len(r.get("kills") or [])
        r["lost_per_failure"] = round((r["wall_seconds"] - own) / kills, 2) if own and kills else None
        categories, paid = r.get("categories"), once.get(r["contender"])
        if kills and categories is not None and paid is not None:
            spent = sum(categories.get(c, 0.0) for c in _FAILURE)
            spent += sum(max(0.0, categories.get(c, 0.0) - paid[c]) for c in _BEYOND_FREE)
            r["ledger_lost_per_failure"] = round(spent / kills, 3)


def _fault_free_once(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each contender's start-up and warm-up in its fault-free runs (the median over rounds), from their
    ledgers' categories."""
    seen: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        if r["schedule"] == "none" and r.get("categories") is not None:
            for c in _BEYOND_FREE:
                seen.setdefault(r["contender"], {}).setdefault(c, []).append(r["categories"].get(c, 0.0))
    return {k: {c: statistics.median(v) for c, v in cats.items()} for k, cats in seen.items()}


def _by_seed(
    rows: list[dict[str, Any]], value: Callable[[dict[str, Any]], float | None]
) -> dict[_Key, float]:
    out: dict[_Key, float] = {}
    for r in rows:
        if r["schedule"] != "none" and (v := value(r)) is not None:
            out[_key(r)] = v
    return out


def _median_over_seeds(
    per_seed: dict[tuple[str, int], float], name: str, out: dict[str, Any], seeds: int
) -> None:
    """``out[name]``: schedule -> the median over its seeds; with more than one seed, ``out[name + "_by_seed"]``
    too: schedule -> the values seed by seed."""
    grouped: dict[str, list[float]] = {}
    for (schedule, _), v in sorted(per_seed.items()):
        grouped.setdefault(schedule, []).append(v)
    if grouped:
        out[name] = {s: round(statistics.median(v), 3) for s, v in grouped.items()}
        if seeds > 1:
            out[f"{name}_by_seed"] = {s: [round(x, 3) for x in v] for s, v in grouped.items()}


def against(rows: list[dict[str, Any]], wall: dict[tuple[str, str], float]) -> dict[str, Any]:
    """warm's and shrink's seconds lost per failure over torchft's and over the baseline's, warm's time over
    torchft's, and each contender's step efficiency (fault-free wall time over wall time), per schedule: the
    ratio seed by seed, then its median over the seeds."""
    seeds = len({int(r.get("seed", 0)) for r in rows if r["schedule"] != "none"})
    out: dict[str, Any] = {}
    for figure in ("lost_per_failure", "ledger_lost_per_failure"):
        lost = _by_seed(rows, lambda r: r.get(figure))  # noqa: B023 (used at once)
        for peer in ("torchft", "baseline"):
            for contender in ("warm", "shrink"):
                per_seed = {
                    (s, seed): v / lost[peer, s, seed]
                    for (c, s, seed), v in lost.items()
                    if c == contender and lost.get((peer, s, seed))
                }
                _median_over_seeds(per_seed, f"{contender}_over_{peer}_{figure}", out, seeds)
    runs = _by_seed(rows, lambda r: r.get("wall_seconds"))
    times = {
        (s, seed): v / runs["torchft", s, seed]
        for (c, s, seed), v in runs.items()
        if c == "warm" and ("torchft", s, seed) in runs
    }
    _median_over_seeds(times, "warm_over_torchft_time", out, seeds)
    if ("warm", "none") in wall and ("torchft", "none") in wall:
        free = round(wall["warm", "none"] / wall["torchft", "none"], 3)
        out["warm_over_torchft_time"] = {"none": free, **out.get("warm_over_torchft_time", {})}
        out["no_faults_warm_over_torchft"] = free
    slowdown = _by_seed(rows, lambda r: r.get("over_fault_free"))
    efficiency: dict[str, Any] = {}
    for contender in sorted({r["contender"] for r in rows} - {"bare"}):
        per_seed = {(s, seed): 1 / v for (c, s, seed), v in slowdown.items() if c == contender and v}
        _median_over_seeds(per_seed, contender, efficiency, 1)
    if efficiency:
        out["step_efficiency"] = efficiency
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the goals name, from the rows :func:`ratios` completed (failed runs left out)."""
    rows = [r for r in rows if "samples_twice" in r]
    timed = [
        r for r in rows if r.get("over_baseline") is not None and r["contender"] not in ("baseline", "bare")
    ]

    def at40(contender: str) -> float | None:
        values = [r["over_baseline"] for r in timed if r["contender"] == contender and r["schedule"] == "40s"]
        return round(statistics.median(values), 3) if values else None

    wall = median_walls(rows)
    bare = wall.get(("bare", "none"))
    by_round = {
        (r["contender"], r.get("round", 0)): r["wall_seconds"] for r in rows if r["schedule"] == "none"
    }
    goodput_rows = [r for r in rows if r["contender"] in GOODPUT]
    # every goodput contender's price without faults; shrink's fault-free run is warm with no hot spare
    over_bare = {c: round(wall[c, "none"] / bare, 3) for c in GOODPUT if bare and wall.get((c, "none"))}
    return {
        "warm_over_baseline_at_40s": at40("warm"),
        "shrink_over_baseline_at_40s": at40("shrink"),
        "slowest_over_baseline": max(  # goodput's slowest row: the peers' rows are theirs
            (r["over_baseline"] for r in timed if r["contender"] in GOODPUT), default=None
        ),
        "no_faults_warm_over_bare": over_bare.get("warm"),
        "no_faults_over_bare": over_bare,
        "no_faults_warm_over_bare_by_round": [
            round(by_round["warm", n] / by_round["bare", n], 3)
            for n in sorted({n for _, n in by_round})
            if ("warm", n) in by_round and ("bare", n) in by_round
        ],
        **against(rows, wall),
        "goodput_samples_wrong": sum(r["samples_twice"] + r["samples_never"] for r in goodput_rows),
        "baseline_samples_wrong": sum(
            r["samples_twice"] + r["samples_never"] for r in rows if r["contender"] == "baseline"
        ),
    }
