"""Shrink and regrow with no spare: time goodput and capacity goodput when failures are answered in place.

A job with no spare left answers a failure by going on with the survivors (a *shrink*, ``S`` seconds from the
failure noticed to training again) and takes a rank back when a replacement is ready (a *grow*, ``G`` seconds,
the state copy included). Nothing rolls back to a checkpoint: a failure loses the step it interrupted (``L``)
and costs its detection ``D``. The replacement is ready ``T`` (*regrow*) after the failure was noticed, so the
group trains short of that rank for ``T - S`` (nothing, when the replacement is ready before the shrink is done).

With failures at rate ``1/M`` over the job's time (first order: each failure's costs and short time apart),

    goodput           = base x (1 - K/M),           K = D + S + G + L
    capacity goodput  = goodput x (1 - (T - S) / (M x N))

where ``base`` is the goodput of everything else (the checkpoint stalls, and the restarts of failures a
shrink does not answer) and ``N`` the reserved ranks. The second line is Little's law: while training, the
mean number of missing ranks is the failure rate times the time each one is missed by a group that trains,
``(T - S)/M``; each productive second counts at the world size in force over ``N``, and failures that come at
random are as likely in a productive second as in any other. A rank lost while another is still missing counts
once more, so the form holds while the missing ranks stay well below ``N``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from goodput.errors import ConfigError
from goodput.planning.model import FloatRecord

__all__ = ["ShrinkGoodput", "goodput_shrink"]


@dataclass(frozen=True)
class ShrinkGoodput(FloatRecord):
    """The model's answer: time and capacity goodput, the badput of one failure (``K``) in seconds, and
    ``short_share``: the mean number of missing ranks over the job's time (``(T - S)/M``)."""

    goodput: float
    capacity_goodput: float
    waste_per_failure: float
    short_share: float


def goodput_shrink(
    *,
    mtbf: float,
    ranks: int,
    shrink: float,
    grow: float,
    regrow: float,
    detect: float = 0.0,
    lost: float = 0.0,
    base: float = 1.0,
) -> ShrinkGoodput:
    """Expected goodput and capacity goodput of a job that shrinks at each failure and grows back.

    Args:
        mtbf: seconds between failures the job answers by shrinking (M).
        ranks: the ranks the job reserved (N); a shrink needs at least 2.
        shrink: failure noticed to training again on the survivors (S).
        grow: replacement ready to training again at the larger size (G).
        regrow: failure noticed to a replacement ready to join (T).
        detect: failure to failure noticed (D).
        lost: work lost per failure: the interrupted step (L).
        base: goodput of everything else, e.g. ``interval / (interval + stall)`` for checkpoint stalls.

    Raises:
        ConfigError: a negative cost, a non-positive MTBF, fewer than 2 ranks or a base outside [0, 1].
    """
    costs = (("shrink", shrink), ("grow", grow), ("regrow", regrow), ("detect", detect), ("lost", lost))
    for name, value in costs:
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name} must be >= 0 seconds, got {value!r}")
    if not (math.isfinite(mtbf) and mtbf > 0):
        raise ConfigError(f"mtbf must be > 0 seconds, got {mtbf!r}")
    if ranks < 2:
        raise ConfigError(f"a job of {ranks} rank(s) cannot shrink: it needs at least 2")
    if not 0.0 <= base <= 1.0:
        raise ConfigError(f"base goodput must be in [0, 1], got {base!r}")
    waste = detect + shrink + grow + lost
    training = max(0.0, 1.0 - waste / mtbf)
    short = max(0.0, regrow - shrink) / mtbf
    time_goodput = base * training
    return ShrinkGoodput(
        goodput=time_goodput,
        capacity_goodput=time_goodput * max(0.0, 1.0 - short / ranks),
        waste_per_failure=waste,
        short_share=short,
    )
