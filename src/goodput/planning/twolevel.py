"""Two-level checkpointing: a fast memory tier saved often, a durable tier saved seldom. Pure functions.

Most failures (a crashed process, a GPU that falls off the bus, a killed rank) leave the node's RAM, or a peer
node's copy of it, intact: they are recovered from the memory tier. Only a share ``s`` of failures needs the
durable tier (the memory tier and its replica both lost, e.g. two nodes at once, or no replica). That is the
multi-level model of Vaidya (1994, "A case for two-level distributed recovery schemes"), of Di, Robert,
Vivien and Cappello (2014/2017, "Optimization of multi-level checkpoint model for large scale HPC
applications") and of LLNL's SCR (Moody et al., SC'10). With the single-level symbols of
:mod:`goodput.planning.model`, level 1 (memory) and level 2 (durable), durable saves every ``tau2`` of compute,
memory saves every ``tau1 <= tau2``, failures at rate ``1/M``:

    waste = C1/tau1 + C2/tau2 + (1-s)/M * (tau1/2 + W1 + R1 + D) + s/M * (tau2/2 + W2 + R2 + D)

so to first order the two levels decouple: each level is a single-level problem whose failure rate is its own
share, ``M1 = M/(1-s)`` and ``M2 = M/s``, and each interval is the single-level optimum for its C, W and share
(Young's ``sqrt(2 C M_level)``, Daly's higher-order form here). The durable interval is then rounded to a
whole number of memory intervals. ``simulate_two_level`` checks the closed form by Monte Carlo.

What the memory tier cannot cover: with a replica on a peer node, a node loss is covered unless the peer is
lost too; ``durable_share`` takes the planner's assumption that the peer is lost with the same probability,
independently (``node_loss_share**2``); without replicas (or with one node) every node loss needs the
durable tier.

``goodput_covered`` is the same split for a run's report, where the durable interval is measured rather than
chosen: Daly's exact model for the failures only the durable tier recovers, and for the others only the work
they lose (half the memory interval, or the step in flight where a warm restart takes a survivor's state) and
their restart. With every failure needing the durable tier it is :func:`goodput.planning.goodput_daly` exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from goodput.errors import ConfigError
from goodput.planning.model import Costs, FloatRecord, goodput_daly, optimal_interval

__all__ = [
    "TwoLevelCosts",
    "TwoLevelPlan",
    "durable_share",
    "goodput_covered",
    "goodput_two_level",
    "plan_two_level",
    "simulate_two_level",
]


def durable_share(node_loss_share: float, *, replicated: bool) -> float:
    """The share of failures the memory tier cannot recover (see the module docstring)."""
    if not 0.0 <= node_loss_share <= 1.0:
        raise ConfigError(f"node-loss share must be in [0, 1], got {node_loss_share!r}")
    return node_loss_share**2 if replicated else node_loss_share


@dataclass(frozen=True, kw_only=True)
class TwoLevelCosts:
    """What the two tiers cost and the failures they meet (seconds; the symbols of the module docstring).

    Attributes:
        c1, w1, r1: the memory tier's stall, persist and restart.
        c2, w2, r2: the durable tier's stall, persist and restart.
        mtbf: mean time between failures of the job, all of them.
        share: the share of failures only the durable tier recovers.
        detect: time from any failure until it is noticed.
    """

    c1: float
    w1: float
    c2: float
    w2: float
    mtbf: float
    share: float
    r1: float = 0.0
    r2: float = 0.0
    detect: float = 0.0


def goodput_two_level(tau1: float, tau2: float, costs: TwoLevelCosts) -> float:
    """First-order goodput of two-level checkpointing (the waste formula of the module docstring)."""
    c, share = costs, costs.share
    stalls = c.c1 / tau1 + (c.c2 / tau2 if math.isfinite(tau2) else 0.0)
    memory = (1.0 - share) / c.mtbf * (tau1 / 2.0 + c.w1 + c.r1 + c.detect)
    durable = share / c.mtbf * (tau2 / 2.0 + c.w2 + c.r2 + c.detect) if share > 0 else 0.0
    return 1.0 - stalls - memory - durable


def goodput_covered(interval: float, costs: Costs, *, durable_share: float, covered_loss: float) -> float:
    """Goodput of a durable tier saved every ``interval`` when only ``durable_share`` of failures need it.

    Those failures (rate ``durable_share / M``) cost what Daly's exact model gives at ``M / durable_share``;
    each of the others (rate ``(1 - durable_share) / M``) loses ``covered_loss`` seconds of work, then restarts
    and is detected, and takes that time out of the wall time (first order: these failures are short).

    Args:
        interval, costs: as :func:`goodput.planning.goodput_daly` (the durable tier's interval, stall C and
            persist W; the restart R and detection D of any failure; the MTBF of all failures).
        durable_share: the share of failures the memory tier (or a survivor's state) cannot recover.
        covered_loss: work lost by one failure it does recover, in seconds.

    Raises:
        ConfigError: a share outside [0, 1] or a negative loss.
    """
    if not 0.0 <= durable_share <= 1.0:
        raise ConfigError(f"the durable share must be in [0, 1], got {durable_share!r}")
    if not (math.isfinite(covered_loss) and covered_loss >= 0.0):
        raise ConfigError(f"covered_loss must be >= 0 seconds, got {covered_loss!r}")
    if durable_share == 1.0:
        return goodput_daly(interval, costs)
    if durable_share > 0.0:
        base = goodput_daly(interval, replace(costs, mtbf=costs.mtbf / durable_share))
    else:  # no failure reaches the durable tier: its saves cost only their stall (and the wait for W)
        base = interval / (interval + costs.ckpt_stall + max(0.0, costs.persist - interval))
    covered = (1.0 - durable_share) / costs.mtbf * (covered_loss + costs.restart + costs.detect)
    return base * max(0.0, 1.0 - covered)


@dataclass(frozen=True)
class TwoLevelPlan(FloatRecord):
    """The two intervals and what they give (seconds; ``durable_every`` memory intervals per durable save).

    ``single_level_goodput`` is the durable tier alone at its own single-level optimum, for comparison.
    """

    memory_interval: float
    durable_interval: float
    durable_every: int
    goodput: float
    single_level_interval: float
    single_level_goodput: float
    lost_work_per_failure: float
    single_level_lost_work_per_failure: float


def plan_two_level(costs: TwoLevelCosts, *, max_interval: float = math.inf) -> TwoLevelPlan:
    """The memory and durable intervals that maximise goodput, and the single-level plan they replace.

    Raises:
        ConfigError: a negative cost, a non-positive MTBF or a share outside [0, 1].
    """
    for name in ("c1", "w1", "c2", "w2", "r1", "r2", "detect"):
        value = getattr(costs, name)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name} must be >= 0 seconds, got {value!r}")
    c1, w1, c2, w2, mtbf, share = costs.c1, costs.w1, costs.c2, costs.w2, costs.mtbf, costs.share
    if not mtbf > 0:
        raise ConfigError(f"mtbf must be > 0 seconds, got {mtbf!r}")
    if not 0.0 <= share <= 1.0:
        raise ConfigError(f"the durable share must be in [0, 1], got {share!r}")
    tau1 = min(max(_level_optimum(c1, mtbf / max(1.0 - share, 1e-12), w1), w1, 1e-9), max_interval)
    raw2 = _level_optimum(c2, mtbf / share, w2) if share > 0 else math.inf
    raw2 = min(max(raw2, w2, tau1), max_interval)
    every = max(1, round(raw2 / tau1)) if math.isfinite(raw2) else 0
    tau2 = every * tau1 if every else math.inf
    single = min(max(_level_optimum(c2, mtbf, w2), w2), max_interval)
    return TwoLevelPlan(
        memory_interval=tau1,
        durable_interval=tau2,
        durable_every=every,
        goodput=goodput_two_level(tau1, tau2, costs),
        single_level_interval=single,
        single_level_goodput=goodput_two_level(single, single, replace(costs, share=1.0)),
        lost_work_per_failure=(1 - share) * (tau1 / 2 + w1) + (share * (tau2 / 2 + w2) if share else 0.0),
        single_level_lost_work_per_failure=single / 2 + w2,
    )


def _level_optimum(stall: float, mtbf: float, persist: float) -> float:
    """One level's single-level optimum, for its stall (at least 1 ns), failure rate and persist time."""
    return optimal_interval(Costs(ckpt_stall=max(stall, 1e-9), mtbf=mtbf, persist=persist))


def simulate_two_level(
    costs: TwoLevelCosts, *, intervals: int, tau1: float, every: int, runs: int = 300, seed: int = 0
) -> tuple[float, float]:
    """Monte Carlo goodput (mean, standard error) of a two-level job of ``intervals`` memory intervals.

    Every ``every``-th memory checkpoint is also durable (``every = 0``: none is). A failure is a node loss
    needing the durable tier with probability ``share``; it rolls back to the newest checkpoint of the tier
    that recovers it whose persist time had passed, then spends ``detect`` plus that tier's restart (a failure
    during which starts the downtime over). Assumes ``w1 <= tau1`` (one save in flight never waits).
    """
    if intervals < 1 or runs < 2 or not (tau1 > 0 and costs.mtbf > 0):
        raise ConfigError("simulate_two_level needs intervals >= 1, runs >= 2, tau1 > 0 and mtbf > 0")
    rng = np.random.default_rng(seed)
    ends, durable = _schedule(intervals, tau1, every, costs.c1, costs.c2)
    goodput = np.array([intervals * tau1 / _one_job(rng, ends, durable, costs) for _ in range(runs)])
    return float(goodput.mean()), float(goodput.std(ddof=1) / math.sqrt(runs))


def _schedule(n: int, tau1: float, every: int, c1: float, c2: float) -> tuple[np.ndarray, np.ndarray]:
    """Stall-end times of checkpoints 1..n from a fresh start, and which of them are durable."""
    durable = np.array([every > 0 and (i + 1) % every == 0 for i in range(n)])
    segment = tau1 + c1 + np.where(durable, c2, 0.0)
    return np.cumsum(segment), durable


def _one_job(rng: np.random.Generator, ends: np.ndarray, durable: np.ndarray, costs: TwoLevelCosts) -> float:
    w1, w2, mtbf, share = costs.w1, costs.w2, costs.mtbf, costs.share
    down1, down2 = costs.r1 + costs.detect, costs.r2 + costs.detect
    n = len(ends)
    mem_done, dur_done, wall = 0, 0, 0.0
    while True:
        origin = ends[mem_done - 1] if mem_done else 0.0
        rel = ends[mem_done:] - origin
        gap = float(rng.exponential(mtbf))
        if gap >= rel[-1]:
            return wall + float(rel[-1])
        wall += gap
        mem_ok = np.nonzero(rel + w1 <= gap)[0]
        dur_ok = np.nonzero(durable[mem_done:] & (rel + w2 <= gap))[0]
        new_dur = mem_done + int(dur_ok[-1]) + 1 if dur_ok.size else dur_done
        if rng.random() < share:
            mem_done = dur_done = new_dur
            down = down2
        else:
            mem_done = mem_done + int(mem_ok[-1]) + 1 if mem_ok.size else mem_done
            dur_done = new_dur
            down = down1
        while down > 0:  # a failure during the downtime starts it over
            hit = float(rng.exponential(mtbf))
            if hit >= down:
                wall += down
                break
            wall += hit
        if mem_done >= n:
            return wall
