"""How often to checkpoint, and what goodput to expect: the planner's closed forms.

Pure functions: no I/O, no clocks, no torch. Every time is in **seconds**; rates are per day or per year as
named. The symbols used throughout:

- ``tau`` (interval): compute time between two checkpoints (Daly's tau; the stall is not part of it).
- ``C`` (ckpt_stall): time training is blocked by one checkpoint.
- ``W`` (persist): time after the stall until the checkpoint is durable (an async save's upload). A failure
  in that window loses the previous interval too, so on average each failure loses ``W`` more work.
- ``R`` (restart): time from noticing a failure to training again (reschedule, load the checkpoint).
- ``D`` (detect): time from the failure until it is noticed (timeouts, health checks).
- ``M`` (mtbf): mean time between failures of the whole job.

Two models of goodput (useful compute / wall time):

- First order: ``G = 1 - C/tau - (R + D + tau/2 + W)/M``. Good while ``tau`` and ``C`` are small against
  ``M``; it goes negative where that breaks.
- Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps", eq. 20: one
  interval plus its checkpoint takes, in expectation, ``M * exp(R'/M) * (exp((tau + C)/M) - 1)`` of wall time
  with failures anywhere, including during a restart (which then starts over). Here ``R' = R + D + W``: the
  detection delay is downtime like the restart, and the ``W`` of extra lost work is redone after every
  restart, exposed to failures like the restart is. Goodput is ``tau`` over that.

In both, when ``tau < W`` the next save first waits for the previous one to persist (one save in flight), so the
stall grows by ``W - tau``. Charging ``W`` per failure is exact to first order; ``goodput plan --simulate``, which
loses exactly the work since the last durable checkpoint, shows the exact model is slightly pessimistic when
``W`` is a large part of ``tau`` (by ~2.5 points of goodput at tau = 1 h, W = 1.5 h, M = 10 h).

In Daly's model the restart term is a constant factor, so the best interval does not depend on ``R``, ``D`` or
``W``; only the floor ``tau >= W`` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from goodput.errors import ConfigError

__all__ = [
    "Costs",
    "PlanInputs",
    "daily_waste",
    "daly_expected_time",
    "daly_interval",
    "effective_stall",
    "failure_probability",
    "goodput_daly",
    "goodput_first_order",
    "lost_work_per_failure",
    "mtbf_from_rate",
    "mtbf_seconds",
    "optimal_interval",
    "waste_per_failure",
    "young_interval",
]

DAY = 86400.0
YEAR_DAYS = 365.0
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
# exp() overflows a float past ~709; a segment that long against the MTBF never finishes in practice.
_MAX_EXPONENT = 700.0


def failure_probability(gpus: float, afr: float, days: float) -> float:
    """Probability that a job sees at least one failure: ``1 - exp(-gpus * afr * days / 365)``.

    Args:
        gpus: devices the job runs on (each fails independently).
        afr: annualized failure rate of one device (failures per device-year, e.g. 0.01).
        days: the job's length in days.
    """
    return -math.expm1(-gpus * afr * days / YEAR_DAYS)


def mtbf_seconds(gpus: float, afr: float) -> float:
    """Mean time between failures of a job on ``gpus`` devices with annualized failure rate ``afr``."""
    return YEAR_DAYS * DAY / (gpus * afr)


def mtbf_from_rate(failures_per_day: float) -> float:
    """Mean time between failures from an observed interruption rate (failures per day)."""
    return DAY / failures_per_day


def lost_work_per_failure(interval: float, *, persist: float = 0.0) -> float:
    """Expected compute lost to one failure: half an interval, plus ``persist`` for a not-yet-durable save."""
    return interval / 2.0 + persist


def waste_per_failure(
    interval: float, *, restart: float = 0.0, persist: float = 0.0, detect: float = 0.0
) -> float:
    """Expected wall time one failure costs: lost work plus detection plus restart."""
    return lost_work_per_failure(interval, persist=persist) + restart + detect


@dataclass(frozen=True, kw_only=True)
class Costs:
    """What checkpoints and failures cost a job, in seconds: the ``C``, ``M``, ``R``, ``W`` and ``D`` above.

    Attributes:
        ckpt_stall: blocking time of one checkpoint (C).
        mtbf: mean time between failures of the job (M).
        restart: time from noticing a failure to training again (R).
        persist: time after the stall until a checkpoint is durable (W).
        detect: time from a failure until it is noticed (D).
    """

    ckpt_stall: float
    mtbf: float
    restart: float = 0.0
    persist: float = 0.0
    detect: float = 0.0


def daily_waste(interval: float, costs: Costs) -> float:
    """Seconds lost per day to checkpoint stalls and failures (first order: ``DAY * (1 - G)``).

    When ``interval < persist`` every save first waits ``persist - interval`` for the previous one.
    """
    c = costs
    stalls = DAY * effective_stall(interval, c.ckpt_stall, c.persist) / interval
    lost = waste_per_failure(interval, restart=c.restart, persist=c.persist, detect=c.detect)
    return stalls + DAY / c.mtbf * lost


def goodput_first_order(interval: float, costs: Costs) -> float:
    """First-order goodput ``1 - C/tau - (R + D + tau/2 + W)/M`` (negative where the model breaks down)."""
    return 1.0 - daily_waste(interval, costs) / DAY


def effective_stall(interval: float, ckpt_stall: float, persist: float) -> float:
    """The stall plus the wait for the previous save to persist (one save in flight)."""
    return ckpt_stall + max(0.0, persist - interval)


def _segment_time(interval: float, ckpt_stall: float, mtbf: float, restart_total: float) -> float:
    """Daly's expected wall time of one interval plus its checkpoint (``inf`` when it practically never ends)."""
    exponent = (interval + ckpt_stall) / mtbf
    if exponent + restart_total / mtbf > _MAX_EXPONENT:
        return math.inf
    return mtbf * math.exp(restart_total / mtbf) * math.expm1(exponent)


def daly_expected_time(work: float, interval: float, costs: Costs) -> float:
    """Expected wall time to finish ``work`` seconds of compute (Daly 2006, eq. 20, with R' = R + D + W).

    ``work / interval`` intervals each end with a checkpoint; failures strike anywhere, restarts included.

    Args:
        work: failure-free compute time of the job.
        interval: compute time between checkpoints.
        costs: the checkpoint's and the failures' costs.
    """
    c = costs
    stall = effective_stall(interval, c.ckpt_stall, c.persist)
    return work / interval * _segment_time(interval, stall, c.mtbf, c.restart + c.detect + c.persist)


def goodput_daly(interval: float, costs: Costs) -> float:
    """Goodput under Daly's exact expected-time model: useful compute over expected wall time, in [0, 1)."""
    return interval / daly_expected_time(interval, interval, costs)


def young_interval(ckpt_stall: float, mtbf: float) -> float:
    """Young's (1974) first-order optimum ``sqrt(2 C M)``."""
    return math.sqrt(2.0 * ckpt_stall * mtbf)


def daly_interval(ckpt_stall: float, mtbf: float) -> float:
    """Daly's (2006) higher-order optimum (eq. 37); ``M`` itself when ``C >= 2M``.

    ``sqrt(2CM) * (1 + sqrt(C/2M)/3 + (C/2M)/9) - C``.
    """
    if ckpt_stall >= 2.0 * mtbf:
        return mtbf
    ratio = ckpt_stall / (2.0 * mtbf)
    return math.sqrt(2.0 * ckpt_stall * mtbf) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - ckpt_stall


def optimal_interval(costs: Costs) -> float:
    """The interval that maximises goodput under Daly's exact model, never shorter than ``persist``.

    A golden-section search on log(interval) over ``[persist, max(M, persist)]``: the true optimum always
    lies below ``M``. With no stall and no persist time the answer is 0 (checkpoint as often as possible).

    Args:
        costs: C and M; W, the lower bound of the answer; R and D, accepted for a complete picture, do not move
            Daly's optimum.

    Returns:
        The compute time between checkpoints, in seconds (``inf`` when the job never fails).

    Raises:
        ConfigError: when ``mtbf`` is not positive or a cost is negative or not a number.
    """
    ckpt_stall, mtbf, persist = costs.ckpt_stall, costs.mtbf, costs.persist
    if not mtbf > 0.0:
        raise ConfigError(f"mtbf must be > 0 seconds, got {mtbf!r}")
    for name in ("ckpt_stall", "restart", "persist", "detect"):
        value = getattr(costs, name)
        if not (math.isfinite(value) and value >= 0.0):
            raise ConfigError(f"{name} must be a duration >= 0 seconds, got {value!r}")
    if math.isinf(mtbf):
        return math.inf
    if ckpt_stall == 0.0:
        return persist
    low, high = max(persist, mtbf * 1e-12), max(mtbf, persist)
    if high <= low:
        return low

    def cost(log_tau: float) -> float:
        # Expected wall time per second of compute; the constant restart factor is left out.
        tau = math.exp(log_tau)
        return _segment_time(tau, ckpt_stall, mtbf, 0.0) / tau

    best = math.exp(_golden_minimum(cost, math.log(low), math.log(high)))
    return low if cost(math.log(low)) <= cost(math.log(best)) else best


def _golden_minimum(cost: Callable[[float], float], a: float, b: float) -> float:
    """The minimiser of a unimodal ``cost`` on ``[a, b]`` by golden-section search, to 1e-12."""
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = cost(c), cost(d)
    while b - a > 1e-12:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = cost(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = cost(d)
    return (a + b) / 2.0


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    """A job to plan for: its failure rate and its checkpoint costs (all durations in seconds).

    Give either ``gpus`` and ``afr``, or ``failures_per_day`` (optionally observed on ``observed_gpus``
    devices and scaled to ``gpus``: failures grow with the number of devices).

    Attributes:
        days: the job's length in days; needed only for the failure probability and the simulation.
        gpus: devices in the job.
        afr: annualized failure rate of one device, in (0, 1).
        failures_per_day: observed interruptions per day (of this job, or of one on ``observed_gpus``).
        observed_gpus: devices of the job whose ``failures_per_day`` was observed (then ``gpus`` is this one's).
        ckpt_stall: blocking time of one checkpoint (C).
        persist: time after the stall until a checkpoint is durable (W).
        restart: time from noticing a failure to training again (R).
        detect: time from a failure until it is noticed (D).
    """

    days: float | None = None
    gpus: int | None = None
    afr: float | None = None
    failures_per_day: float | None = None
    observed_gpus: int | None = None
    ckpt_stall: float = 0.0
    persist: float = 0.0
    restart: float = 0.0
    detect: float = 0.0

    def __post_init__(self) -> None:
        if self.days is not None and not (math.isfinite(self.days) and self.days > 0):
            raise ConfigError(f"days must be a positive number, got {self.days!r}")
        if self.failures_per_day is not None:
            self._check_observed()
        else:
            if self.observed_gpus is not None:
                raise ConfigError("observed_gpus scales an observed failures_per_day: give failures_per_day")
            if self.gpus is None or self.afr is None:
                raise ConfigError(
                    f"give both gpus and afr, or failures_per_day (got gpus={self.gpus!r}, afr={self.afr!r})"
                )
            _check_gpus("gpus", self.gpus)
            if not (0.0 < self.afr < 1.0):
                raise ConfigError(f"afr must be in (0, 1) (e.g. 0.01 for 1% a year), got {self.afr!r}")
        for name in ("ckpt_stall", "persist", "restart", "detect"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a duration >= 0 seconds, got {value!r}")

    def _check_observed(self) -> None:
        assert self.failures_per_day is not None
        if self.afr is not None or (self.gpus is not None and self.observed_gpus is None):
            raise ConfigError(
                "give either failures_per_day or gpus and afr, not both (to scale an observed rate to "
                f"another job size give observed_gpus too; got failures_per_day={self.failures_per_day!r}, "
                f"gpus={self.gpus!r}, afr={self.afr!r})"
            )
        if not (math.isfinite(self.failures_per_day) and self.failures_per_day > 0):
            raise ConfigError(f"failures_per_day must be a positive number, got {self.failures_per_day!r}")
        if self.observed_gpus is not None:
            if self.gpus is None:
                raise ConfigError("observed_gpus needs gpus: the job size to scale the observed rate to")
            _check_gpus("observed_gpus", self.observed_gpus)
            _check_gpus("gpus", self.gpus)

    @property
    def job_failures_per_day(self) -> float:
        """Failures per day of this job (an observed rate scaled from ``observed_gpus`` to ``gpus``)."""
        if self.failures_per_day is None:
            return DAY / self.mtbf
        if self.observed_gpus is not None and self.gpus is not None:
            return self.failures_per_day * self.gpus / self.observed_gpus
        return self.failures_per_day

    @property
    def mtbf(self) -> float:
        """Mean time between failures of the job, in seconds."""
        if self.failures_per_day is not None:
            return mtbf_from_rate(self.job_failures_per_day)
        assert self.gpus is not None and self.afr is not None  # checked in __post_init__
        return mtbf_seconds(self.gpus, self.afr)

    @property
    def failure_probability(self) -> float | None:
        """Probability of at least one failure during the job (None without ``days``)."""
        if self.days is None:
            return None
        return -math.expm1(-self.days * DAY / self.mtbf)

    def costs(self) -> Costs:
        """The costs the model functions take: this job's stall, MTBF, restart, persist and detection."""
        return Costs(
            ckpt_stall=self.ckpt_stall,
            mtbf=self.mtbf,
            restart=self.restart,
            persist=self.persist,
            detect=self.detect,
        )


class FloatRecord:
    """A base of the dataclasses of numbers the planner answers with: ``to_dict`` gives each field as a float."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    def to_dict(self) -> dict[str, float]:
        """A JSON-able copy."""
        return {name: float(getattr(self, name)) for name in self.__dataclass_fields__}


def _check_gpus(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a whole number >= 1, got {value!r}")
