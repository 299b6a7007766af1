"""Reading the demo's per-step sample logs across attempts of different world sizes (elastic tests)."""

from __future__ import annotations

import json
import os
from collections import defaultdict

BATCH = 16  # the demo's per-rank batch


def effective_steps(run_dir: str) -> dict[int, list[dict]]:
    """Step -> the records (one per rank) of the last attempt that trained it."""
    records: dict[int, list[dict]] = defaultdict(list)
    folder = os.path.join(run_dir, "samples")
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by the SIGKILL
                records[record["step"]].append({**record, "rank": name})
    effective = {}
    for step, rows in records.items():
        last = max(r["attempt"] for r in rows)
        effective[step] = [r for r in rows if r["attempt"] == last]
    return effective


def check_one_numbering(run_dir: str) -> dict[int, int]:
    """Attempt -> world size, after checking that every rank of each round recorded the same attempt number:
    the ranks that started an attempt are exactly ``0 .. world_size - 1`` of that attempt, and numbers only grow
    with the rounds' start times."""
    from goodput.ledger import read_events

    starts = [e for e in read_events(run_dir, rank=None) if e["event"] == "attempt_start"]
    worlds: dict[int, set[int]] = defaultdict(set)
    ranks: dict[int, set[int]] = defaultdict(set)
    for event in starts:
        worlds[event["attempt"]].add(event["world_size"])
        ranks[event["attempt"]].add(event["rank"])
    for attempt, sizes in worlds.items():
        assert len(sizes) == 1, f"attempt {attempt} names rounds of world sizes {sorted(sizes)}"
        assert ranks[attempt] == set(range(next(iter(sizes)))), (attempt, sorted(ranks[attempt]), sizes)
    first_wall = {a: min(e["wall"] for e in starts if e["attempt"] == a) for a in worlds}
    assert sorted(first_wall, key=first_wall.__getitem__) == sorted(first_wall), first_wall
    return {attempt: next(iter(sizes)) for attempt, sizes in worlds.items()}
