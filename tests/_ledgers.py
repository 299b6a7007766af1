"""Hand-built ledgers for tests: events with chosen times, and writing them in the ledger's file layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Attempt:
    """Builds one attempt's events; ``mono`` runs on a clock with an arbitrary per-attempt origin."""

    def __init__(self, number: int, process_start: float, start: float, mono_origin: float = 1000.0) -> None:
        self.number = number
        self.offset = mono_origin - start
        self.events: list[dict[str, Any]] = []
        self.add("attempt_start", start, process_start=process_start)

    def add(self, name: str, t: float, **fields: Any) -> Attempt:
        self.events.append(
            {"event": name, "wall": t, "mono": t + self.offset, "attempt": self.number, "rank": 0, **fields}
        )
        return self

    def step(self, step: int, start: float, end: float, fetch: float = 0.0) -> Attempt:
        self.add("step_start", start, step=step)
        return self.add("step_end", end, step=step, fetch_seconds=fetch)

    def save(self, step: int, start: float, stall_end: float, durable: float | None) -> Attempt:
        self.add("checkpoint_stall_start", start, step=step)
        self.add("checkpoint_stall_end", stall_end, step=step)
        if durable is not None:
            self.add("checkpoint_durable", durable, step=step)
        return self


def write_run(run_dir: Path, attempts: list[Attempt], *, rank: int = 0) -> Path:
    """Write each attempt's events to ``run_dir/ledger/attempt-N.rank-R.jsonl`` as the Ledger would."""
    folder = run_dir / "ledger"
    folder.mkdir(parents=True, exist_ok=True)
    for attempt in attempts:
        path = folder / f"attempt-{attempt.number:04d}.rank-{rank:05d}.jsonl"
        path.write_text("".join(json.dumps({**e, "rank": rank}) + "\n" for e in attempt.events))
    return run_dir
