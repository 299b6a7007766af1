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
