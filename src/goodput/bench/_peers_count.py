"""The bookkeeping of ``goodput bench peers``: what each run trained, from its step records (pure functions).

Every contender logs, per rank, one record per step it trains
(``{"step": s, "samples": [...], "attempt": a}``), a redone step once more, before the step's gradients leave
the rank: a rank killed after they are summed, whose step its peers complete, has logged it too. The run's
*lineage* is what its final model learned from: for each step, the records of the newest attempt that trained
it, each rank's last (a rollback discards the earlier ones with the model state they produced; a step redone
by fewer ranks after a shrink in place discards the other ranks' records of it too, as their samples are in
the survivors' larger batches). ``attempt`` is the same on every rank of an attempt and grows with each
restart or reshape; a record without it counts as attempt 0. Against the same contender's fault-free lineage
(the order its loader gives when nothing fails), a sample trained more often than there is *twice*, one
trained less often is *never*; both are 0 for a run whose data position survives every failure. Steps trained
more than once are the work the failures cost (``steps_redone``), counted on rank 0.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["exactness", "lineage", "read_records"]


def read_records(run_dir: str) -> dict[int, list[dict[str, Any]]]:
    """Each rank's step records, in the order written (a torn last line is skipped)."""
    folder = os.path.join(run_dir, "samples")
    out: dict[int, list[dict[str, Any]]] = {}
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("rank-") and name.endswith(".jsonl")):
            continue
        rank = int(name[5:-6])
        with open(os.path.join(folder, name)) as f:
            rows = []
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue  # a record torn by the SIGKILL
        out[rank] = rows
    return out


def lineage(
    records: Mapping[int, Iterable[Mapping[str, Any]]], steps: int
) -> dict[int, dict[int, list[int]]]:
    """rank -> step -> the samples of that step's record in the lineage, for steps 1..``steps``."""
    rows = {
        rank: [r for r in rank_rows if 1 <= int(r["step"]) <= steps] for rank, rank_rows in records.items()
    }
    newest: dict[int, int] = {}
    for rank_rows in rows.values():
        for row in rank_rows:
            step = int(row["step"])
            newest[step] = max(newest.get(step, 0), int(row.get("attempt", 0)))
    out: dict[int, dict[int, list[int]]] = {}
    for rank, rank_rows in rows.items():
        kept: dict[int, list[int]] = {}
        for row in rank_rows:
            if int(row.get("attempt", 0)) == newest[int(row["step"])]:
                kept[int(row["step"])] = [int(s) for s in row["samples"]]
        out[rank] = kept
    return out


def _counts(line: Mapping[int, Mapping[int, list[int]]]) -> Counter[int]:
    counts: Counter[int] = Counter()
    for steps in line.values():
        for samples in steps.values():
            counts.update(samples)
    return counts


def exactness(
    records: Mapping[int, list[Mapping[str, Any]]],
    reference: Mapping[int, list[Mapping[str, Any]]],
    steps: int,
) -> dict[str, int]:
    """Samples trained twice or never against ``reference`` (the fault-free records), steps redone, steps
    missing from the lineage (a run that stopped short)."""
    mine, ref = lineage(records, steps), lineage(reference, steps)
    have, want = _counts(mine), _counts(ref)
    rank0 = [int(row["step"]) for row in records.get(0, []) if 1 <= int(row["step"]) <= steps]
    learned = set().union(*(line.keys() for line in mine.values())) if mine else set()
    return {
        "samples_twice": sum(max(0, n - want[s]) for s, n in have.items()),
        "samples_never": sum(max(0, n - have[s]) for s, n in want.items()),
        "steps_redone": len(rank0) - len(set(rank0)),
        "steps_missing": steps - len(learned),
    }
