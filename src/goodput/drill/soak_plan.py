"""The soak's fault schedule: drawn from a seed with exponential gaps, and its replay file.

Pure (no clock, no processes): the schedule is a function of the seed, the mean time between faults, the
soak's length and the script's measured step time, so a replay file that holds them (or the schedule itself)
draws the same faults again. Every fault is placed at a step, the measured step time turning each drawn second
into a step: the in-process faults (``kill``, ``nan``, ``spike``, ``slow``) become one fault plan
(:mod:`goodput.faults`) that every launch of the soak is given; ``preempt`` is a SIGTERM the soak sends to
``goodput launch`` once the job has trained past its step, followed by the same command again.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
from typing import Any

from goodput.errors import ConfigError

__all__ = ["KINDS", "REPLAY_FILE", "SoakFault", "SoakPlan", "draw_schedule", "fault_plan", "read_replay"]

KINDS = ("kill", "nan", "spike", "slow", "preempt")
REPLAY_FILE = "soak-replay.json"
SLOW_SECONDS = 2.0  # a slow rank's pause at its step: below any hang timeout, above a step's noise
SPIKE_FACTOR = 50  # the drill's spike: the loss multiplied by it at one step


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoakFault:
    """One fault of the schedule.

    Attributes:
        kind: one of :data:`KINDS`.
        seconds: when it was drawn, in seconds of training from the start.
        step: the step it fires at (``preempt``: the step after which the SIGTERM is sent).
        rank: the rank it hits (None: every rank, or the launcher).
    """

    kind: str
    seconds: float
    step: int
    rank: int | None = None

    def plan(self) -> str:
        """The fault in :mod:`goodput.faults` syntax; empty for ``preempt``, which the soak sends itself."""
        where = f"step={self.step}" + (f",rank={self.rank}" if self.rank is not None else "")
        return {
            "kill": f"kill@{where}",
            "nan": f"nan@{where}",
            "spike": f"spike@step={self.step},factor={SPIKE_FACTOR}",
            "slow": f"slow@{where},seconds={SLOW_SECONDS:g}",
            "preempt": "",
        }[self.kind]

    def text(self) -> str:
        """The fault in a few words, for progress lines."""
        on = f" rank {self.rank}" if self.rank is not None else ""
        what = {"preempt": "SIGTERM to goodput launch, then the same command again"}.get(
            self.kind, self.plan()
        )
        return f"{self.kind}{on} at step {self.step} ({what})"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoakPlan:
    """What a soak draws and what replays it.

    Attributes:
        seed: the seed of the draw.
        mtbf: the mean seconds between faults.
        seconds: the soak's length of training, in seconds.
        steps: the steps the job trains.
        step_seconds: the script's measured seconds per step.
        schedule: the faults, in step order.
    """

    seed: int
    mtbf: float
    seconds: float
    steps: int
    step_seconds: float
    schedule: tuple[SoakFault, ...]

    def to_json(self, violation: str = "") -> dict[str, Any]:
        """The replay file's content: the plan and the violation that stopped the soak."""
        return {**dataclasses.asdict(self), "violation": violation}


def draw_schedule(
    *, seed: int, mtbf: float, seconds: float, step_seconds: float, steps: int, first_step: int, world: int
) -> tuple[SoakFault, ...]:
    """Faults at exponential gaps of mean ``mtbf`` over ``seconds`` of training, each of a kind and rank drawn
    from ``seed``, at distinct steps from ``first_step`` (a checkpoint and the spike rule's warm-up before it)
    to the last but two (a fault must find steps after it)."""
    if mtbf <= 0 or step_seconds <= 0:
        raise ConfigError(f"need --mtbf > 0 and a positive step time, got {mtbf} and {step_seconds}")
    draw = random.Random(seed)
    used: set[int] = set()
    faults = []
    at = draw.expovariate(1 / mtbf)
    while at < seconds:
        step = max(first_step, round(at / step_seconds))
        while step in used:
            step += 1
        kind = draw.choice(KINDS)
        rank = draw.randrange(world) if kind in ("kill", "nan", "slow") else None
        if step < steps - 2:
            used.add(step)
            faults.append(SoakFault(kind=kind, seconds=round(at, 3), step=step, rank=rank))
        at += draw.expovariate(1 / mtbf)
    return tuple(sorted(faults, key=lambda f: f.step))


def fault_plan(schedule: Sequence[SoakFault]) -> str:
    """The in-process faults of ``schedule`` as one fault plan (every launch of the soak gets the same one: a
    fault fires once per run and rank, its marker kept in the run folder)."""
    return "; ".join(p for f in schedule if (p := f.plan()))


def read_replay(path: str) -> SoakPlan:
    """The plan a replay file holds.

    Raises:
        ConfigError: the file is missing or is not a soak's replay file.
    """
    try:
        with open(path) as f:
            data = json.load(f)
        schedule = tuple(SoakFault(**fault) for fault in data["schedule"])
        return SoakPlan(
            seed=int(data["seed"]), mtbf=float(data["mtbf"]), seconds=float(data["seconds"]),
            steps=int(data["steps"]), step_seconds=float(data["step_seconds"]), schedule=schedule,
        )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"--replay {path}: not a soak replay file ({err})") from None
