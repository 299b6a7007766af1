"""The per-rank batch of a step, and the rule that keeps the global batch when a warm job shrinks or grows.

A step of ``W`` ranks consumes ``W * B`` samples. To keep the global batch ``G`` (and with it the meaning of a
step for the learning-rate schedule) when the world size changes, each rank takes ``B = G // W``: the per-rank
batch grows as the job shrinks. That needs ``G`` divisible by every world size the job may train on, which under
``goodput launch --restart warm --shrink-after`` is every ``W`` from ``--min-world`` to the reserved ranks; the
loader checks it when it is built, before any step, so a job never discovers at its first shrink that it cannot
keep its batch.
"""

from __future__ import annotations

import os
from typing import Any

from goodput._env import RESERVED_WORLD, WARM_MIN_WORLD
from goodput.errors import ConfigError

__all__ = ["check_shrinkable", "per_rank_batch", "regroup"]


def per_rank_batch(batch_size: int | None, global_batch_size: int | None, world_size: int) -> int:
    """The per-rank batch: ``batch_size``, or ``global_batch_size`` split evenly over the ranks.

    Raises:
        ConfigError: both or neither given, a global batch that does not split over ``world_size``, or one
            that does not split over every world size a shrinking warm job may train on.
    """
    if (batch_size is None) == (global_batch_size is None):
        raise ConfigError("give ResumableLoader exactly one of batch_size (per rank) and global_batch_size")
    check_shrinkable(global_batch_size)
    if global_batch_size is None:
        assert batch_size is not None
        return batch_size
    _positive("global_batch_size", global_batch_size)
    if global_batch_size % world_size:
        raise ConfigError(
            f"global_batch_size {global_batch_size} does not split over {world_size} ranks: run on a world size "
            f"that divides it ({_divisors(global_batch_size)}) or change global_batch_size"
        )
    return global_batch_size // world_size


def check_shrinkable(global_batch_size: int | None) -> None:
    """Under ``--shrink-after``: the global batch must split over every world size from ``--min-world`` to the
    reserved ranks (the per-rank batch grows as the job shrinks); a per-rank ``batch_size`` is refused, since
    it would change the global batch at every shrink.

    Raises:
        ConfigError: the rule, and the world sizes that break it.
    """
    low = WARM_MIN_WORLD.get()
    if not low:
        return
    high = int(RESERVED_WORLD.get() or os.environ.get("WORLD_SIZE", "1"))
    sizes = range(int(low), high + 1)
    if global_batch_size is None:
        raise ConfigError(
            "--shrink-after trains on fewer ranks after a failure: give ResumableLoader global_batch_size= "
            "(kept on every world size by a larger per-rank batch) instead of a per-rank batch_size"
        )
    _positive("global_batch_size", global_batch_size)
    bad = [w for w in sizes if global_batch_size % w]
    if bad:
        raise ConfigError(
            f"global_batch_size {global_batch_size} does not split over {', '.join(map(str, bad))} ranks: with "
            f"--shrink-after the job may train on any of {low}..{high} ranks, so the global batch must be a "
            f"multiple of each (e.g. {_lcm(sizes)}); raise --min-world or change global_batch_size"
        )


def regroup(loader: Any, rank: int, world_size: int) -> bool:
    """Re-split a kept loader over a new world (a warm job shrank or grew): the same global position and global
    batch, this rank's new share. Whether it changed anything (False for a loader built for this world, or for
    one that is not a ResumableLoader).

    Raises:
        ConfigError: a loader with a per-rank ``batch_size``, which cannot keep the global batch.
    """
    sampler = getattr(loader, "sampler", None)
    if sampler is None or not hasattr(loader, "keeps_global_batch"):
        return False
    if (sampler.rank, sampler.world_size) == (rank, world_size):
        return False
    if not loader.keeps_global_batch:
        raise ConfigError(
            f"the job now trains on {world_size} ranks: give ResumableLoader global_batch_size= to keep the "
            "global batch, or build the loader inside the training function"
        )
    sampler.batch_size = per_rank_batch(None, loader.global_batch_size, world_size)
    sampler.rank, sampler.world_size = rank, world_size
    return True


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _divisors(n: int) -> str:
    fits = [w for w in range(1, min(n, 64) + 1) if n % w == 0]
    return ", ".join(map(str, fits[:8])) + (", ..." if len(fits) > 8 else "")


def _lcm(sizes: range) -> int:
    import math

    out = 1
    for w in sizes:
        out = out * w // math.gcd(out, w)
    return out
