"""ResumableSampler: the data position of one rank, and the batches it takes from there.

The position is global: ``(epoch, consumed)`` counts the samples of the epoch that the training loops of all
ranks have received. Ranks step in lockstep (data-parallel training), so when rank ``r`` receives its ``k``-th
batch of a run that started at position ``c0``, every rank has received step ``k``, and the position is
``c0 + k * world_size * batch_size``. The state is therefore the same on every rank, and a run resumed on a
different number of ranks continues the epoch from the same position: the remaining samples are split over
the new ranks, none repeated, none skipped.

Only delivered batches move the position, never batches that DataLoader workers or prefetchers produced ahead,
so any number of workers and any prefetch depth resume exactly. Resuming costs O(1): the position is two
integers and the order is computed per position (:mod:`goodput.data.order`).

A skip list (``skip``; ranges of positions of an epoch, e.g. the batches that sent the loss to NaN) is part of
the position: a plan steps over every skipped range, so no rank ever trains those samples again, whichever
checkpoint a later attempt resumes from, and every other sample of the epoch is still trained once. A range is
stepped over whole steps at a time (positions advance by ``world_size * batch_size``); where a range does not
start on a step boundary of the current world size, the few positions between the last whole step and the
range are skipped with it. A position holding skips is saved as format 2 (goodput before the skip list refuses
it rather than train those samples); without skips it stays format 1.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from goodput.data.order import EpochOrder, rank_batch_count, rank_batch_range, sample_seeds
from goodput.errors import ConfigError, FingerprintMismatch

__all__ = ["BatchPlan", "ResumableSampler"]

STATE_FORMAT = 2
_BLOCK = 32  # batches whose indices ``BatchPlan.indices`` works out together
_KEYS = ("format", "seed", "epoch", "consumed", "world_size", "fingerprint")  # and "skips" since format 2


@dataclass(frozen=True)
class BatchPlan:
    """The batches one rank takes from a position to the end of that epoch (one iteration of the loader)."""

    order: EpochOrder
    start: int
    world_size: int
    rank: int
    batch_size: int
    count: int
    generation: int
    seeded: bool
    # (first position, end position, first step) of each run of positions between skipped ranges; () when no
    # skip lies ahead: one run from ``start`` to the end of the epoch
    segments: tuple[tuple[int, int, int], ...] = ()
    # batches' indices worked out a block at a time (see ``indices``)
    _memo: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def remaining(self) -> int:
        return self.order.size - self.start

    def indices(self, step: int) -> np.ndarray:
        """Dataset indices of this rank's batch ``step``, in order (read-only)."""
        known = self._memo.get(step)
        if known is not None:
            return known
        # The order is a keyed permutation evaluated with numpy: for a 16-sample batch its fixed cost per
        # call is most of the work, so a block of batches is worked out at once (the loader's prefetch and
        # the DataLoader's sampler each ask for every batch, a few steps apart).
        if len(self._memo) > 4 * _BLOCK:
            self._memo.clear()
        steps = range(step, max(step + 1, min(step + _BLOCK, self.count)))
        bounds = [self._range(s) for s in steps]
        positions = np.concatenate([np.arange(lo, hi) for lo, hi in bounds])
        every = self.order.at(positions)
        every.setflags(write=False)
        cut = 0
        for s, (lo, hi) in zip(steps, bounds, strict=True):
            self._memo[s] = every[cut : cut + hi - lo]
            cut += hi - lo
        return self._memo[step]

    def _locate(self, step: int) -> tuple[int, int, int]:
        """(first position of the run holding ``step``, the step's number in it, the run's length)."""
        for lo, hi, first in reversed(self.segments):
            if step >= first:
                return lo, step - first, hi - lo
        return self.start, step, self.remaining

    def _range(self, step: int) -> tuple[int, int]:
        lo, local, length = self._locate(step)
        return rank_batch_range(lo, local, self.world_size, self.rank, self.batch_size, length)

    def keys(self, step: int) -> list[Any]:
        """What the DataLoader fetches for batch ``step``: indices, or (index, seed) pairs when seeded."""
        idx = self.indices(step)
        if not self.seeded:
            return idx.tolist()
        seeds = sample_seeds(self.order.seed, self.order.epoch, idx)
        return list(zip(idx.tolist(), seeds.tolist(), strict=True))

    def consumed_after(self, step: int) -> int:
        """The global position once every rank has received batch ``step``."""
        lo, local, length = self._locate(step)
        return min(lo + length, lo + (local + 1) * self.world_size * self.batch_size)


class ResumableSampler:
    """The batch sampler behind :class:`~goodput.data.loader.ResumableLoader` (one per rank).

    Iterating it yields the index lists of the plan set by :meth:`begin`; :meth:`delivered` moves the position
    when the training loop receives a batch.

    Args:
        size: samples in the dataset.
        batch_size: samples per batch on this rank.
        seed: seed of the sample order and of per-sample seeds.
        shuffle: False keeps dataset order.
        drop_last: drop the epoch's last, partial global step instead of splitting it over the ranks.
        rank: this process's rank.
        world_size: number of ranks.
        identity: the dataset's identity for the fingerprint.
        shard_sizes: samples per shard for the shard-aware order (None: global shuffle).
        shard_window: shards shuffled together in the shard-aware order.
        seeded: yield (index, seed) pairs instead of indices.
        allow_fingerprint_mismatch: warn instead of raising when a restored position's dataset differs.
    """

    def __init__(
        self,
        size: int,
        *,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        identity: str = "",
        shard_sizes: Sequence[int] | None = None,
        shard_window: int = 1,
        seeded: bool = False,
        allow_fingerprint_mismatch: bool = False,
    ) -> None:
        self.size = size
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.identity = identity
        self.shard_sizes = None if shard_sizes is None else [int(s) for s in shard_sizes]
        self.shard_window = shard_window
        self.seeded = seeded
        self.allow_fingerprint_mismatch = allow_fingerprint_mismatch
        self.epoch = 0
        self.consumed = 0
        self._generation = 0
        self._plan: BatchPlan | None = None
        self._order: EpochOrder | None = None
        self._last: tuple[BatchPlan, int] | None = None  # the batch the training loop received last
        self.skips: list[tuple[int, int, int]] = []  # (epoch, first position, end position) never trained
        self._kind = self.order().describe()  # the same for every epoch

    # -- position -------------------------------------------------------------------------------------------

    def order(self, epoch: int | None = None) -> EpochOrder:
        """The sample order of ``epoch`` (default: the current one); the latest one is kept for reuse."""
        epoch = self.epoch if epoch is None else epoch
        cached = self._order
        if cached is None or (cached.seed, cached.epoch) != (self.seed, epoch):
            cached = self._order = EpochOrder(
                seed=self.seed,
                epoch=epoch,
                size=self.size,
                shuffle=self.shuffle,
                shard_sizes=self.shard_sizes,
                window=self.shard_window,
            )
        return cached

    def fingerprint(self) -> dict[str, Any]:
        """What identifies the data a position refers to: size, identity and kind of order."""
        return {"size": self.size, "identity": self.identity, "order": self._kind}

    def set_epoch(self, epoch: int) -> None:
        """Move to the start of ``epoch``; a no-op when already in it (so a resumed position is kept)."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0
            self._generation += 1

    def batches_per_epoch(self) -> int:
        """This rank's batches in a whole epoch at the current world size."""
        return rank_batch_count(
            self.size, self.world_size, self.rank, self.batch_size, drop_last=self.drop_last
        )

    # -- iteration ------------------------------------------------------------------------------------------

    def begin(self) -> BatchPlan:
        """Plan this rank's batches from the current position to the end of the epoch."""
        self._generation += 1
        segments = self._segments()
        if segments:
            self.consumed = segments[0][0]  # a position inside a skipped range moves past it
        remaining = self.size - self.consumed
        count = rank_batch_count(
            remaining, self.world_size, self.rank, self.batch_size, drop_last=self.drop_last
        )
        if segments:
            last = segments[-1]
            count = last[2] + (
                rank_batch_count(
                    last[1] - last[0], self.world_size, self.rank, self.batch_size, drop_last=self.drop_last
                )
                if last[1] == self.size
                else (last[1] - last[0]) // (self.world_size * self.batch_size)
            )
        self._plan = BatchPlan(
            order=self.order(),
            start=self.consumed,
            world_size=self.world_size,
            rank=self.rank,
            batch_size=self.batch_size,
            count=count,
            generation=self._generation,
            seeded=self.seeded,
            segments=segments if len(segments) > 1 or (segments and segments[0][1] < self.size) else (),
        )
        return self._plan

    def _segments(self) -> tuple[tuple[int, int, int], ...]:
        """The runs of positions from the current one to the end of the epoch between skipped ranges (() when
        no skipped range lies ahead); runs before a skipped range hold whole steps only."""
        ahead = sorted((lo, hi) for epoch, lo, hi in self.skips if epoch == self.epoch and hi > self.consumed)
        if not ahead:
            return ()
        step = self.world_size * self.batch_size
        position, first, runs = self.consumed, 0, []
        for lo, hi in ahead:
            whole = max(0, lo - position) // step
            if whole:
                runs.append((position, position + whole * step, first))
                first += whole
            position = max(position, hi)
        if position < self.size:
            runs.append((position, self.size, first))
        return tuple(runs) if runs else ((self.size, self.size, 0),)

    def skip(self, epoch: int, lo: int, hi: int) -> None:
        """Never train positions ``[lo, hi)`` of ``epoch`` (from the next iteration on; kept in the state)."""
        if not 0 <= lo < hi or epoch < 0:
            raise ConfigError(f"a skipped range needs 0 <= lo < hi and epoch >= 0, got {epoch}:{lo}-{hi}")
        if (epoch, lo, hi) not in self.skips:
            self.skips.append((epoch, lo, min(hi, self.size)))

    def __iter__(self) -> Iterator[list[Any]]:
        plan = self._plan if self._plan is not None else self.begin()
        self._plan = None
        for step in range(plan.count):
            yield plan.keys(step)

    def __len__(self) -> int:
        return self.batches_per_epoch()

    def delivered(self, plan: BatchPlan, step: int) -> None:
        """The training loop received batch ``step`` of ``plan``: move the position past it."""
        if plan.generation != self._generation:
            raise ConfigError(
                "the data position was changed (load_state_dict or set_epoch) during an iteration; "
                "change it before starting to iterate"
            )
        self.consumed = plan.consumed_after(step)
        self._last = (plan, step)
        if step == plan.count - 1:
            self.finished(plan)

    def last_indices(self) -> np.ndarray | None:
        """Dataset indices of the batch the training loop received last (None before the first)."""
        return None if self._last is None else self._last[0].indices(self._last[1])

    def finished(self, plan: BatchPlan) -> None:
        """``plan`` ran to its end: the position moves to the start of the next epoch (once)."""
        if plan.generation == self._generation and plan.order.epoch == self.epoch:
            self.epoch, self.consumed = self.epoch + 1, 0

    # -- state ----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The position as a small JSON-serialisable dict with constant keys (the same on every rank)."""
        return {
            "format": STATE_FORMAT if self.skips else 1,
            "seed": self.seed,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "world_size": self.world_size,
            "fingerprint": self.fingerprint(),
            "skips": [list(s) for s in self.skips],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position (on any world size).

        Raises:
            ConfigError: the state is malformed or from a newer format version.
            FingerprintMismatch: the dataset or order differs from the saved one (unless allowed).
        """
        _check_state(state)
        saved = state["fingerprint"]
        if state["seed"] != self.seed:
            warnings.warn(
                f"restored data position uses seed {state['seed']} (this loader was built with {self.seed})",
                stacklevel=3,
            )
            self.seed = int(state["seed"])
        differences = _differences(saved, self.fingerprint())
        if differences and not self.allow_fingerprint_mismatch:
            raise FingerprintMismatch(
                f"the dataset differs from the one the data position was saved with: {differences} "
                "(pass allow_fingerprint_mismatch=True to resume anyway)"
            )
        if differences:
            warnings.warn(f"resuming a data position saved for different data: {differences}", stacklevel=3)
        self.epoch = int(state["epoch"])
        self.consumed = min(int(state["consumed"]), self.size)
        if self.consumed == self.size:
            self.epoch, self.consumed = self.epoch + 1, 0
        self.skips = [(int(e), int(lo), int(hi)) for e, lo, hi in state.get("skips", [])]
        self._generation += 1


def _check_state(state: Any) -> None:
    if not isinstance(state, dict) or "format" not in state:
        raise ConfigError(f"not a data position state (expected a dict with keys {', '.join(_KEYS)})")
    version = state["format"]
    if not isinstance(version, int) or version > STATE_FORMAT:
        raise ConfigError(
            f"data position has format version {version!r}, newer than this goodput's {STATE_FORMAT}: "
            "upgrade goodput to resume it"
        )
    missing = [key for key in _KEYS if key not in state]
    if missing:
        raise ConfigError(f"data position state lacks {', '.join(missing)}")
    for key in ("seed", "epoch", "consumed", "world_size"):
        if not isinstance(state[key], int) or state[key] < 0:
            raise ConfigError(f"data position state has a bad {key}: {state[key]!r}")
    if not isinstance(state["fingerprint"], dict):
        raise ConfigError(f"data position state has a bad fingerprint: {state['fingerprint']!r}")
    skips = state.get("skips", [])
    if not isinstance(skips, list) or not all(
        isinstance(s, list) and len(s) == 3 and all(isinstance(v, int) and v >= 0 for v in s) for s in skips
    ):
        raise ConfigError(f"data position state has a bad skip list: {skips!r}")


def _differences(saved: dict[str, Any], current: dict[str, Any]) -> str:
    parts = [
        f"{key} {current.get(key)!r} != saved {saved.get(key)!r}"
        for key in ("size", "identity", "order")
        if saved.get(key) != current.get(key)
    ]
    return "; ".join(parts)
