"""A Monte Carlo simulation of a checkpointed job under random failures: the planner's cross-check.

The job does ``n`` intervals of ``interval`` seconds of compute, each followed by a checkpoint that blocks for
``ckpt_stall`` and becomes durable ``persist`` seconds after the stall ends (one save in flight: if the next
checkpoint is due before that, it waits). Failures arrive as a Poisson process with mean gap ``mtbf``, at any
time. A failure rolls the job back to the newest *durable* checkpoint; the job then spends ``detect +
restart`` before computing again, and a failure during that downtime starts it over (Daly's assumption). The
job ends when the last checkpoint's stall ends.

Unlike the closed forms, the simulator loses exactly the work since the last durable checkpoint, so a failure
in the persist window really loses the interval before it; the closed forms charge ``persist`` per failure on
average instead. With ``persist = 0`` Daly's model is exact for this job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from goodput.errors import ConfigError
from goodput.planning.model import Costs, FloatRecord, daly_expected_time

__all__ = ["SimulationResult", "simulate_goodput"]

# The simulation steps once per failure; past this many expected failures per job it would not end in time.
_MAX_EXPECTED_FAILURES = 100_000


@dataclass(frozen=True)
class SimulationResult(FloatRecord):
    """What the Monte Carlo runs measured (times in seconds).

    Attributes:
        runs: simulated jobs.
        work: failure-free compute of one job.
        wall_mean: mean wall time of a job.
        wall_stderr: standard error of ``wall_mean``.
        goodput_mean: mean over runs of ``work / wall``.
        goodput_stderr: standard error of ``goodput_mean``.
        goodput_p5: 5th percentile of goodput over runs.
        goodput_p50: median goodput.
        goodput_p95: 95th percentile of goodput.
        failures_mean: mean failures per job (restarts interrupted by a failure included).
    """

    runs: int
    work: float
    wall_mean: float
    wall_stderr: float
    goodput_mean: float
    goodput_stderr: float
    goodput_p5: float
    goodput_p50: float
    goodput_p95: float
    failures_mean: float


def _check(name: str, value: float, *, positive: bool) -> None:
    ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        raise ConfigError(f"{name} must be {'> 0' if positive else '>= 0'} seconds, got {value!r}")


def _validate(intervals: int, interval: float, costs: Costs, runs: int) -> None:
    """Refuse inputs that make no job, or a job that would practically never finish."""
    if intervals < 1 or runs < 2:
        raise ConfigError(f"intervals must be >= 1 and runs >= 2, got intervals={intervals!r}, runs={runs!r}")
    for name, value in (("interval", interval), ("mtbf", costs.mtbf)):
        _check(name, value, positive=True)
    for name in ("ckpt_stall", "restart", "persist", "detect"):
        _check(name, getattr(costs, name), positive=False)
    mtbf = costs.mtbf
    expected_wall = daly_expected_time(intervals * interval, interval, costs)
    if not expected_wall / mtbf <= _MAX_EXPECTED_FAILURES:
        raise ConfigError(
            f"a job of {intervals} intervals of {interval:g} s with an MTBF of {mtbf:g} s expects "
            f"{expected_wall / mtbf:.3g} failures (more than {_MAX_EXPECTED_FAILURES}); it would practically never "
            "finish, so there is nothing to simulate: use a shorter interval"
        )


def simulate_goodput(
    costs: Costs, *, intervals: int, interval: float, runs: int = 1000, seed: int = 0
) -> SimulationResult:
    """Simulate ``runs`` jobs of ``intervals`` checkpointed intervals and summarise their goodput.

    Args:
        costs: the checkpoint's and the failures' costs.
        intervals: intervals (each ending with a checkpoint) the job needs; its work is ``intervals * interval``.
        interval: compute time between checkpoints.
        runs: jobs to simulate (at least 2, for an error estimate).
        seed: seed of the numpy Generator; the same seed gives the same result.

    Raises:
        ConfigError: on a non-positive interval, MTBF, run or interval count, a negative cost, or a job so long
            against the MTBF that it expects more than 100,000 failures (it would practically never finish).
    """
    _validate(intervals, interval, costs, runs)
    rng = np.random.default_rng(seed)
    wall, failures = _simulate(rng, intervals, interval, costs, runs)
    work = intervals * interval
    goodput = work / wall
    root = math.sqrt(runs)
    p5, p50, p95 = np.percentile(goodput, [5, 50, 95])
    return SimulationResult(
        runs=runs,
        work=work,
        wall_mean=float(wall.mean()),
        wall_stderr=float(wall.std(ddof=1) / root),
        goodput_mean=float(goodput.mean()),
        goodput_stderr=float(goodput.std(ddof=1) / root),
        goodput_p5=float(p5),
        goodput_p50=float(p50),
        goodput_p95=float(p95),
        failures_mean=float(failures.mean()),
    )


def _simulate(
    rng: np.random.Generator, n: int, tau: float, costs: Costs, runs: int
) -> tuple[np.ndarray, np.ndarray]:
    """Wall times and failure counts of ``runs`` jobs, all advanced together one failure at a time.

    After a restart no save is pending, so checkpoint ``j`` (1-based) of the stretch ends its stall at
    ``tau + stall + (j - 1) * period`` and is durable ``persist`` later, with ``period = max(tau, persist) +
    stall`` (the wait for the previous save to persist is part of the period).
    """
    stall, mtbf, persist, down = costs.ckpt_stall, costs.mtbf, costs.persist, costs.restart + costs.detect
    period = max(tau, persist) + stall
    first_end = tau + stall
    done = np.zeros(runs, dtype=np.int64)  # durable intervals
    wall = np.zeros(runs)
    failures = np.zeros(runs, dtype=np.int64)
    active = np.arange(runs)
    while active.size:
        left = n - done[active]
        finish = first_end + (left - 1) * period
        gap = rng.exponential(mtbf, active.size)
        ends = gap >= finish
        wall[active[ends]] += finish[ends]
        active, gap, left = active[~ends], gap[~ends], left[~ends]
        wall[active] += gap
        failures[active] += 1
        durable = np.floor((gap - first_end - persist) / period) + 1
        done[active] += np.clip(durable, 0, left - 1).astype(np.int64)
        _downtime(rng, active, wall, failures, mtbf, down)
    return wall, failures


def _downtime(
    rng: np.random.Generator,
    runs: np.ndarray,
    wall: np.ndarray,
    failures: np.ndarray,
    mtbf: float,
    down: float,
) -> None:
    """Add the detection + restart time to ``runs``, starting it over after every failure that hits it."""
    pending = runs
    while pending.size and down > 0:
        gap = rng.exponential(mtbf, pending.size)
        through = gap >= down
        wall[pending[through]] += down
        pending, gap = pending[~through], gap[~through]
        wall[pending] += gap
        failures[pending] += 1
