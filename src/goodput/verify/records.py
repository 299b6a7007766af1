"""Reading what ``Run`` recorded for verify-resume (:mod:`goodput.run.records` writes it): each rank's
effective steps (the last time each was trained) and its final state's digests.

A step's pending line (its batch handed to the loop) is replaced by the step's own record when the rank got that
far; it stays the step's last record when the rank died inside a step that its peers completed and the job kept.
A step that no rank recorded done was not kept: its pending lines are dropped.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from typing import Any

from goodput.run.records import FINAL_FILE, RECORDS_DIR, RECORDS_ENV, STEPS_FILE, StepRecorder, state_digests

__all__ = ["RECORDS_ENV", "RunRecords", "StepRecord", "StepRecorder", "read_records", "state_digests"]


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One step as one rank trained it (the last time)."""

    step: int
    rank: int
    attempt: int
    resumed: int
    samples: str | None
    count: int | None
    loss: str | None
    rng: dict[str, str]
    world: int | None = None  # the attempt's world size (from its header; None: not recorded)
    ids: tuple[int, ...] | None = None  # the dataset indices (None: not recorded)
    pending: bool = False  # the batch was handed to the loop, the step never recorded done (no loss, no rng)


@dataclasses.dataclass(frozen=True)
class RunRecords:
    """What a run's ranks recorded: the effective steps and the final state of each rank.

    Attributes:
        steps: rank -> step -> the last record of that step.
        final: rank -> {"attempt", "step", "state": {piece: digest}} (ranks that closed).
        attempts: the attempt numbers that recorded anything.
    """

    steps: dict[int, dict[int, StepRecord]]
    final: dict[int, dict[str, Any]]
    attempts: list[int]


def read_records(run_dir: str) -> RunRecords:
    """Read a run's records; a torn last line (a killed writer) is ignored.

    Raises:
        FileNotFoundError: the run recorded nothing (not run with ``GOODPUT_RECORDS``, or no ``Run``).
    """
    folder = os.path.join(run_dir, RECORDS_DIR)
    names = os.listdir(folder)
    files = sorted((int(m[1]), int(m[2]), n) for n in names if (m := STEPS_FILE.match(n)))
    steps: dict[int, dict[int, StepRecord]] = {}
    for attempt, rank, name in files:
        with open(os.path.join(folder, name)) as f:
            _read_steps(f, steps.setdefault(rank, {}), rank=rank, attempt=attempt)
    _drop_unfinished(steps)
    final = {}
    for name in names:
        if m := FINAL_FILE.match(name):
            with open(os.path.join(folder, name)) as f:
                final[int(m[1])] = json.load(f)
    return RunRecords(steps=steps, final=final, attempts=sorted({a for a, _, _ in files}))


def _drop_unfinished(steps: dict[int, dict[int, StepRecord]]) -> None:
    """Forget the pending lines of steps that no rank recorded done: a step is kept by the job only when a rank
    finished it (the peers of the rank that died inside it)."""
    done = {step for by_step in steps.values() for step, record in by_step.items() if not record.pending}
    for by_step in steps.values():
        for step in [s for s, record in by_step.items() if record.pending and s not in done]:
            del by_step[step]


def _read_steps(lines: Iterable[str], steps: dict[int, StepRecord], *, rank: int, attempt: int) -> None:
    resumed, world = 0, None
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "resumed" in record:
            resumed = int(record["resumed"])
            world = record.get("world")
            continue
        step = int(record["step"])
        steps[step] = StepRecord(
            step=step,
            rank=rank,
            attempt=attempt,
            resumed=resumed,
            samples=record.get("samples"),
            count=record.get("count"),
            loss=record.get("loss"),
            rng=record.get("rng") or {},
            world=world,
            ids=None if record.get("ids") is None else tuple(record["ids"]),
            pending=bool(record.get("pending")),
        )
