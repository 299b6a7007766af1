"""The soak's fault schedule: drawn from a seed with exponential gaps, and its replay file.

Pure (no clock, no processes): the schedule is a function of the seed, the mean time between faults, the
soak's length and the script's measured step time, so a replay file that holds them (or the schedule itself)
draws the same faults again. Every fault is placed at a step, the measured step time turning each drawn second
into a step: the in-process faults (``kill``, ``hang``, ``nan``, ``spike``, ``bitflip``, ``slow``) become one
fault plan (:mod:`goodput.faults`) that every launch of the soak is given; the soak sends the others itself once
the job has trained past their step (:data:`SENT`), and runs the same command again after each; the store's
faults (:data:`STORE`) open a window of the durable store's refusals or throttling at their step instead.

A bit flip is found only by the guard's next replica check and undone only by a rollback to a checkpoint at or
before the last check that agreed; a restart, a relaunch or another rollback before that check can carry the
flipped replica over (a live hand-over copies a survivor's state) or erase it (a restore), so it would answer
the flip by chance. Each bit flip therefore gets its window to itself, from that check to the one after the
flip: a fault drawn into it is left out, as a bit flip drawn where its window holds a fault is.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Sequence
from typing import Any

from goodput.errors import ConfigError

__all__ = [
    "KINDS",
    "NODE_KINDS",
    "NUMERIC",
    "REPLAY_FILE",
    "SENT",
    "STORE",
    "STORE_WINDOW_SECONDS",
    "Checks",
    "SoakFault",
    "SoakPlan",
    "draw_schedule",
    "fault_plan",
    "read_replay",
    "soak_kinds",
]

KINDS = (
    "kill", "hang", "nan", "spike", "bitflip", "slow", "preempt", "agent", "launcher", "full", "throttled",
)  # fmt: skip
SENT = {  # the kinds the soak sends itself, after the job has trained past their step; then the command again
    "preempt": "SIGTERM to goodput launch",
    "agent": "SIGKILL of the warm agent",
    "launcher": "SIGKILL of goodput launch",
    "node": "SIGKILL of node 1's launcher, agent, ranks and spares at once",  # --nnodes 2: goodput.drill.soak_nodes
}
STORE = {  # the kinds the durable store answers, for a window from their step (goodput.drill.soak_store)
    "full": "the store refuses every write, 507 Insufficient Storage",
    "throttled": "the store answers 50 ms late and 503 SlowDown twice after every 4 requests",
}
NUMERIC = ("nan", "spike", "bitflip")  # the kinds the numeric guard answers with a rollback
# a store fault's window: at least this long, and until the store refused a request
STORE_WINDOW_SECONDS = 5.0
# the kinds a soak on two nodes mixes (the store's faults are one node's soak's, for now)
NODE_KINDS = (*(k for k in KINDS if k not in SENT and k not in STORE), "node")
_RANKED = ("kill", "hang", "nan", "slow", "bitflip")  # the kinds that hit one rank
REPLAY_FILE = "soak-replay.json"
SLOW_SECONDS = 2.0  # a slow rank's pause at its step: below any hang timeout, above a step's noise
SPIKE_FACTOR = 50  # the drill's spike: the loss multiplied by it at one step
FLIP_BIT = 20  # the drill's bit flip: a bit of the float32's mantissa, a change no loss shows at once
SENT_LAG_SECONDS = (
    3.0  # how late a fault the soak sends may land after its step (its polls, the records' lag)
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoakFault:
    """One fault of the schedule.

    Attributes:
        kind: one of :data:`KINDS`.
        seconds: when it was drawn, in seconds of training from the start.
        step: the step it fires at (one of :data:`SENT`: the step after which the soak sends it).
        rank: the rank it hits (None: every rank, the agent or the launcher).
    """

    kind: str
    seconds: float
    step: int
    rank: int | None = None

    def plan(self) -> str:
        """The fault in :mod:`goodput.faults` syntax; empty for the kinds the soak sends itself."""
        where = f"step={self.step}" + (f",rank={self.rank}" if self.rank is not None else "")
        if self.kind in SENT or self.kind in STORE:
            return ""
        return {
            "kill": f"kill@{where}",
            "hang": f"hang@{where}",
            "nan": f"nan@{where}",
            "spike": f"spike@step={self.step},factor={SPIKE_FACTOR}",
            "bitflip": f"bitflip@{where},bit={FLIP_BIT}",
            "slow": f"slow@{where},seconds={SLOW_SECONDS:g}",
        }[self.kind]

    def text(self) -> str:
        """The fault in a few words, for progress lines."""
        on = f" rank {self.rank}" if self.rank is not None else ""
        if self.kind in STORE:
            return f"{self.kind} at step {self.step} ({STORE[self.kind]}, {STORE_WINDOW_SECONDS:g}s or more)"
        what = f"{SENT[self.kind]}, then the same command again" if self.kind in SENT else self.plan()
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


@dataclasses.dataclass(frozen=True)
class Checks:
    """The guard's replica checks, as the script's uninterrupted run showed them: every ``every`` steps, the
    first that can be rolled back to at step ``first`` (the first check with a checkpoint at or before it)."""

    every: int
    first: int


def draw_schedule(
    *, seed: int, mtbf: float, seconds: float, step_seconds: float, steps: int, first_step: int, world: int,
    kinds: Sequence[str] = KINDS, checks: Checks | None = None, rollbacks: tuple[int, int] | None = None,
) -> tuple[SoakFault, ...]:  # fmt: skip
    """Faults at exponential gaps of mean ``mtbf`` over ``seconds`` of training, each of a kind (of ``kinds``)
    and rank drawn from ``seed``, at distinct steps from ``first_step`` (a checkpoint and the spike rule's
    warm-up before it) to the last but two (a fault must find steps after it); a bit flip (only with
    ``checks``) halfway between two checks, in a window of its own (the module's docstring). With
    ``rollbacks`` (the guard's ``(max_rollbacks, rollback_window)``), a numeric fault (each a rollback) drawn
    where the window's steps around it already hold ``max_rollbacks - 1`` of them (one, if that is 1) is left
    out: the guard stops a run whose rollbacks come that close, rightly, and a soak tests recovery, not that
    stop; the room left is for a rollback of the guard's own."""
    if mtbf <= 0 or step_seconds <= 0:
        raise ConfigError(f"need --mtbf > 0 and a positive step time, got {mtbf} and {step_seconds}")
    if "bitflip" in kinds and checks is None:
        raise ConfigError("a bit flip needs the guard's replica checks (NumericConfig(check_every=N))")
    draw = random.Random(seed)
    lag = math.ceil(SENT_LAG_SECONDS / step_seconds)
    faults: list[SoakFault] = []
    windows: list[tuple[int, int]] = []
    at = draw.expovariate(1 / mtbf)
    while at < seconds:
        step = max(first_step, round(at / step_seconds))
        while any(f.step == step for f in faults):
            step += 1
        kind = draw.choice(tuple(kinds))
        rank = draw.randrange(world) if kind in _RANKED else None
        if kind == "bitflip" and checks is not None:
            before = max(checks.first, step // checks.every * checks.every)
            step, window = before + max(1, checks.every // 2), (before - 2, before + checks.every + 2)
            fits = window[1] < steps - 2 and not any(_overlap(_span(f, lag), window) for f in faults)
        else:
            fits = not any(
                _overlap(_span(SoakFault(kind=kind, seconds=0, step=step), lag), w) for w in windows
            )
        if fits and rollbacks is not None and kind in NUMERIC:
            most, window_steps = rollbacks
            near = sum(1 for f in faults if f.kind in NUMERIC and abs(f.step - step) < window_steps)
            fits = near < max(most - 1, 1)
        if step < steps - 2 and fits and all(f.step != step for f in faults):
            faults.append(SoakFault(kind=kind, seconds=round(at, 3), step=step, rank=rank))
            if kind == "bitflip":
                windows.append(window)
        at += draw.expovariate(1 / mtbf)
    return tuple(sorted(faults, key=lambda f: f.step))


def _span(fault: SoakFault, lag: int) -> tuple[int, int]:
    """The steps in which ``fault`` may act: a sent one up to ``lag`` steps late, the others up to their verdict
    (a numeric fault's rollback comes one step after it)."""
    return fault.step, fault.step + (lag if fault.kind in SENT else 2)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def fault_plan(schedule: Sequence[SoakFault]) -> str:
    """The in-process faults of ``schedule`` as one fault plan (every launch of the soak gets the same one: a
    fault fires once per run and rank, its marker kept in the run folder)."""
    return "; ".join(p for f in schedule if (p := f.plan()))


def soak_kinds(nnodes: int) -> tuple[str, ...]:
    """The fault kinds a soak on ``nnodes`` nodes mixes (its default ``--kinds``): on two nodes the in-process
    kinds and ``node`` (:mod:`goodput.drill.soak_nodes`); a preemption and a kill of the agent or the launcher
    are the one-node soak's."""
    return NODE_KINDS if nnodes == 2 else KINDS


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
