"""Hand-built ledgers for tests: events with chosen times, and writing them in the ledger's file layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Attempt:
    """Builds one attempt's events; ``mono`` runs on a clock with an arbitrary per-attempt origin."""

    def __init__(
        self, number: int, process_start: float, start: float, mono_origin: float = 1000.0, **head: Any
    ) -> None:
        """``head``: more attempt_start fields (``launch``, ``restart_count``), as the Ledger records them."""
        self.number = number
        self.offset = mono_origin - start
        self.events: list[dict[str, Any]] = []
        self.add("attempt_start", start, process_start=process_start, **head)

    def add(self, name: str, t: float, **fields: Any) -> Attempt:
        self.events.append(
            {"event": name, "wall": t, "mono": t + self.offset, "attempt": self.number, "rank": 0, **fields}
        )
        return self

    def step(self, step: int, start: float, end: float, fetch: float = 0.0) -> Attempt:
        self.add("step_start", start, step=step)
        return self.add("step_end", end, step=step, fetch_seconds=fetch)

    def save(
        self, step: int, start: float, stall_end: float, durable: float | None, *, waited: float = 0.0
    ) -> Attempt:
        self.add("checkpoint_stall_start", start, step=step)
        self.add("checkpoint_stall_end", stall_end, step=step, **({"waited": waited} if waited else {}))
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


def synthetic_run(
    *,
    step_seconds: float = 0.5,
    fetch_seconds: float = 0.0,
    every_steps: int = 600,
    stall: float = 8.0,
    persist: float = 2.0,
    crashes: tuple[float, ...] = (700.0, 1500.0),
    downtime: float = 20.0,
    end: float = 2400.0,
    strategy: str | None = "dcp",
    keys: tuple[str, ...] | None = ("model", "optimizer", "data", "rng"),
    cache_stats: tuple[dict[str, Any], ...] = (),
    start: float = 1.79e9,
) -> list[Attempt]:
    """A run with exact, even step times: init 6 s, restore 4 s (0.1 s when nothing to restore), a save
    every ``every_steps`` steps, a crash at each time in ``crashes`` (after the step in progress) and
    ``downtime`` before each restart; the last attempt ends cleanly once past ``end``."""
    attempts: list[Attempt] = []
    t, durable, pending = start, 0, list(crashes)
    while True:
        a = Attempt(len(attempts), process_start=t, start=t + 3.0)
        if strategy is not None:
            a.add("checkpoint_config", t + 3.0, strategy=strategy, every_steps=every_steps)
        if keys is not None:
            a.add("state_registered", t + 3.0, keys=list(keys))
        for stats in cache_stats:
            a.add("cache_stats", t + 3.0, **stats)
        t += 6.0
        a.add("init_done", t).add("restore_start", t)
        t += 4.0 if durable else 0.1
        a.add("restore_end", t, step=durable or None)
        step, crash_at = durable, (start + pending.pop(0)) if pending else None
        while True:
            step += 1
            a.step(step, t, t + step_seconds, fetch=fetch_seconds)
            t += step_seconds
            if step % every_steps == 0:
                a.save(step, t, t + stall, durable=t + stall + persist)
                durable, t = step, t + stall
            if crash_at is not None and t >= crash_at:
                break
            if crash_at is None and t >= start + end:
                attempts.append(a.add("attempt_end", t + 1.0, status="ok"))
                return attempts
        attempts.append(a)
        t += downtime


def record_steps(
    ledger: Any, steps: range, *, loss: float, fetch: float = 0.001, save_every: int = 10
) -> None:
    """Record ``steps`` on a real ``goodput.Ledger`` (``fetch`` seconds of data wait each), and a save (its stall
    and its durable event) after every step divisible by ``save_every``."""
    for step in steps:
        ledger.step_start(step)
        ledger.step_end(step, fetch_seconds=fetch, loss=loss)
        if step % save_every == 0:
            ledger.on_event("checkpoint_stall", phase="start", step=step)
            ledger.on_event("checkpoint_stall", phase="end", step=step)
            ledger.on_event("checkpoint_durable", step=step)
