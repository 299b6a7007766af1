"""Real ledgers of a group of ranks, written through the Ledger API on a clock the test sets.

The ledger takes its times from ``time.time()`` and ``time.monotonic()``; :func:`set_clock` points the ledger's
modules at a :class:`Clock` so that a 30-second scenario (steps, a shrink, a grow) is written in milliseconds,
with the times the scenario names. Everything else is the real Ledger: its files, its flush, its fields.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import goodput.ledger.ledger
import goodput.ledger.live
from goodput.ledger import Ledger

EPOCH = 1_800_000_000.0  # the scenario's t = 0, as a wall time


class Clock:
    """Wall and monotonic time at ``t`` seconds into the scenario (monotonic on another origin)."""

    def __init__(self) -> None:
        self.t = 0.0

    def time(self) -> float:
        return EPOCH + self.t

    def monotonic(self) -> float:
        return 5_000.0 + self.t

    def __getattr__(self, name: str) -> Any:  # sleep, strftime, ...: the real module's
        return getattr(time, name)


def set_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Point the ledger's modules at a new :class:`Clock` (undone by ``monkeypatch`` after the test)."""
    clock = Clock()
    monkeypatch.setattr(goodput.ledger.ledger, "time", clock)
    monkeypatch.setattr(goodput.ledger.live, "time", clock)
    return clock


class Group:
    """The ledgers of the ranks training together in one attempt, each writing the same events.

    Args:
        run_dir: the run folder.
        clock: the scenario's clock; the attempt begins at its current time.
        ranks: the ranks of the group (their ledgers' ``rank``).
        attempt: the attempt number every rank records.
        world: ``WORLD_SIZE`` the ledgers see (default: the number of ranks).
        reserved: ``GOODPUT_RESERVED_WORLD`` (None: unset, the ledger records the world size).
    """

    def __init__(
        self,
        run_dir: Path,
        clock: Clock,
        ranks: list[int],
        *,
        attempt: int = 0,
        world: int | None = None,
        reserved: int | None = None,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        self.clock = clock
        monkeypatch.setenv("WORLD_SIZE", str(world or len(ranks)))
        if reserved is None:
            monkeypatch.delenv("GOODPUT_RESERVED_WORLD", raising=False)
        else:
            monkeypatch.setenv("GOODPUT_RESERVED_WORLD", str(reserved))
        began = clock.time()
        self.run_dir = run_dir
        self.ledgers = {r: Ledger(run_dir, rank=r, attempt=attempt, began=began) for r in ranks}

    def join(self, rank: int, attempt: int) -> None:
        """``rank`` opens its ledger now, as attempt ``attempt`` of its own numbering (a warm restart's
        survivor joining a newcomer that was handed its rank earlier)."""
        self.ledgers[rank] = Ledger(self.run_dir, rank=rank, attempt=attempt, began=self.clock.time())

    def steps(self, first: int, count: int, seconds: float = 1.0) -> int:
        """Steps ``first`` .. ``first + count - 1``, ``seconds`` each, back to back; returns the next step."""
        for step in range(first, first + count):
            for ledger in self.ledgers.values():
                ledger.step_start(step)
            self.clock.t += seconds
            for ledger in self.ledgers.values():
                ledger.step_end(step)
        return first + count

    def start_step(self, step: int) -> None:
        """Step ``step`` begins on every rank (and a failure will interrupt it)."""
        for ledger in self.ledgers.values():
            ledger.step_start(step)

    def lose(self, rank: int) -> None:
        """``rank``'s process ends without another event (its ledger is flushed: what it wrote stays)."""
        ledger = self.ledgers.pop(rank)
        ledger.close("exited")

    def event(self, name: str, **fields: Any) -> None:
        for ledger in self.ledgers.values():
            ledger.event(name, **fields)

    def fail(self, reason: str) -> None:
        """Every rank declares the failure and closes the attempt (a warm generation ends)."""
        for ledger in self.ledgers.values():
            ledger.failure_detected(reason)
            ledger.close("failed")

    def close(self) -> None:
        for ledger in self.ledgers.values():
            ledger.close()
