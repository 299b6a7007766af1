"""The sample order of an epoch and its split over ranks: pure functions of (seed, epoch, dataset size).

Nothing here reads a clock, a file or torch.distributed, and nothing materialises the whole order: the sample
at any position of an epoch is computed directly, so finding where a resumed run continues costs the same at
sample 1,000,000 as at sample 0.

The shuffle is a keyed bijection of ``[0, n)``: a balanced Feistel network over the smallest power of four
that holds ``n``, with cycle walking back into range (the standard construction of format-preserving
encryption). Keys come from (seed, epoch), so each epoch has its own order and the same (seed, epoch, n)
always gives the same order, whatever the number of workers, ranks or restarts.

The shard-aware order (for datasets stored as shards of contiguous indices) shuffles the order of the shards,
groups consecutive shards of that order into windows of ``window`` shards, and shuffles samples only within
each window: a rank reads from at most a window of shards at a time, so a remote cache stays local.

Positions are global. A step of ``world_size`` ranks with per-rank batch size ``B`` covers the next
``world_size * B`` positions, rank ``r`` taking the ``r``-th block of ``B``. The epoch's last, partial step
(fewer than ``world_size * B`` positions left) is dropped with ``drop_last`` or split as evenly as possible
over the ranks (sizes differ by at most one; when fewer positions than ranks are left the higher ranks get
none and end the epoch one step early).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["EpochOrder", "rank_batch_count", "rank_batch_range", "sample_seed", "sample_seeds"]

_ROUNDS = 6
_M64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MUL1
    z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def _mix_int(*parts: int) -> int:
    """Hash a tuple of non-negative ints to one 64-bit int (pure, platform independent)."""
    acc = np.zeros(1, dtype=np.uint64)
    for part in parts:
        acc = _mix(acc ^ np.array([part & _M64], dtype=np.uint64))
    return int(acc[0])


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed for sample ``index`` in ``epoch``: for augmentations that must not depend on who loads it.

    Args:
        seed: the loader's seed.
        epoch: the epoch the sample is drawn in.
        index: the sample's index in the dataset.

    Returns:
        A non-negative int below 2**63 (fits ``torch.Generator.manual_seed`` and ``numpy.random``).
    """
    return int(sample_seeds(seed, epoch, np.array([index]))[0])


def sample_seeds(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """Vectorised :func:`sample_seed`: one seed per index, as an int64 array."""
    base = np.uint64(_mix_int(seed, epoch, 0x5EED))
    return (_mix(base ^ _mix(np.asarray(indices, dtype=np.uint64))) >> np.uint64(1)).astype(np.int64)


@functools.lru_cache(maxsize=64)
def _round_keys(seed: int, epoch: int, stream: int) -> np.ndarray:
    return np.array([_mix_int(seed, epoch, stream, r) for r in range(_ROUNDS)], dtype=np.uint64)


def _half_bits(n: np.ndarray) -> np.ndarray:
    """Per element: the half width h with 4**h >= n (at least 1)."""
    bits = np.ceil(np.log2(np.maximum(n, 2).astype(np.float64))).astype(np.uint64)
    half = np.maximum((bits + np.uint64(1)) // np.uint64(2), np.uint64(1))
    return half + ((np.uint64(1) << (np.uint64(2) * half)) < n)  # float rounding near powers of two


def _feistel(x: np.ndarray, half: np.ndarray, keys: np.ndarray, tweak: np.ndarray) -> np.ndarray:
    mask = (np.uint64(1) << half) - np.uint64(1)
    left, right = x >> half, x & mask
    for r in range(_ROUNDS):
        left, right = right, left ^ (_mix(right ^ keys[r] ^ tweak) & mask)
    return (left << half) | right


def _permute(pos: np.ndarray, n: np.ndarray, keys: np.ndarray, tweak: np.ndarray) -> np.ndarray:
    """A keyed bijection of [0, n) per element (n and tweak may vary per element)."""
    half = _half_bits(n)
    out = _feistel(pos, half, keys, tweak)
    bad = out >= n
    while bad.any():  # cycle walking: expected fewer than 4 rounds, since 4**half < 4 * n
        out[bad] = _feistel(out[bad], half[bad], keys, tweak[bad])
        bad = out >= n
    return out


@dataclass(frozen=True)
class EpochOrder:
    """The order of one epoch: ``at(positions)`` gives the dataset index at each position.

    Args:
        seed: the loader's seed.
        epoch: the epoch number.
        size: the number of samples in the dataset.
        shuffle: False keeps dataset order.
        shard_sizes: samples per shard (contiguous in index order) for the shard-aware order, or None for a
            global shuffle.
        window: shards shuffled together in the shard-aware order.
    """

    seed: int
    epoch: int
    size: int
    shuffle: bool = True
    shard_sizes: Sequence[int] | None = None
    window: int = 1

    def __post_init__(self) -> None:
        assert self.size > 0, "the loader validates the dataset size"
        if self.shard_sizes is not None:
            sizes = np.asarray(self.shard_sizes, dtype=np.int64)
            assert int(sizes.sum()) == self.size and (sizes > 0).all(), "validated by the loader"
            object.__setattr__(self, "_shards", self._shard_tables(sizes))

    def describe(self) -> str:
        """A short string naming the kind of order, for fingerprints (changes if the order would change)."""
        if not self.shuffle:
            return "sequential"
        if self.shard_sizes is None:
            return "shuffle"
        crc = zlib.crc32(np.asarray(self.shard_sizes, dtype=np.int64).tobytes())
        return f"shards:window={self.window}:count={len(self.shard_sizes)}:crc={crc:08x}"

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The dataset index at each of ``positions`` (each in ``[0, size)``), as an int64 array."""
        pos = np.asarray(positions, dtype=np.int64)
        if not self.shuffle:
            return pos.copy()
        if self.shard_sizes is None:
            keys = _round_keys(self.seed, self.epoch, 0)
            n = np.full(pos.shape, self.size, dtype=np.uint64)
            tweak = np.zeros(pos.shape, dtype=np.uint64)
            return _permute(pos.astype(np.uint64), n, keys, tweak).astype(np.int64)
        return self._at_sharded(pos)

    def _shard_tables(self, sizes: np.ndarray) -> tuple[np.ndarray, ...]:
        count = len(sizes)
        shard_starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        keys = _round_keys(self.seed, self.epoch, 1)
        ids = np.arange(count, dtype=np.uint64)
        order = _permute(ids, np.full(count, count, np.uint64), keys, np.zeros(count, np.uint64))
        order = order.astype(np.int64)
        ordered_starts = np.concatenate([[0], np.cumsum(sizes[order])])  # positions of each shard, in order
        window_starts = ordered_starts[:: self.window]  # ends with `size` only if count % window == 0
        if window_starts[-1] != self.size:
            window_starts = np.concatenate([window_starts, [self.size]])
        return order, shard_starts, ordered_starts, window_starts

    def _at_sharded(self, pos: np.ndarray) -> np.ndarray:
        order, shard_starts, ordered_starts, window_starts = self._shards  # type: ignore[attr-defined]
        win = np.searchsorted(window_starts, pos, side="right") - 1
        local = pos - window_starts[win]
        win_size = window_starts[win + 1] - window_starts[win]
        keys = _round_keys(self.seed, self.epoch, 2)
        tweak = _mix(win.astype(np.uint64))
        shuffled = _permute(local.astype(np.uint64), win_size.astype(np.uint64), keys, tweak)
        q = window_starts[win] + shuffled.astype(np.int64)  # position in the shard-ordered concatenation
        k = np.searchsorted(ordered_starts, q, side="right") - 1
        return shard_starts[order[k]] + (q - ordered_starts[k])


def _split(remaining: int, world_size: int, batch_size: int, drop_last: bool) -> tuple[int, int]:
    full, tail = divmod(remaining, world_size * batch_size)
    return full, (0 if drop_last else tail)


def rank_batch_count(remaining: int, world_size: int, rank: int, batch_size: int, *, drop_last: bool) -> int:
    """How many batches ``rank`` takes from the ``remaining`` positions of an epoch."""
    full, tail = _split(remaining, world_size, batch_size, drop_last)
    return full + (1 if rank < tail else 0)


def rank_batch_range(
    start: int, step: int, world_size: int, rank: int, batch_size: int, remaining: int
) -> tuple[int, int]:
    """The positions ``[lo, hi)`` of ``rank``'s batch at ``step`` (counted from position ``start``).

    ``remaining`` is the number of positions from ``start`` to the end of the epoch; the step must be one the
    rank takes (see :func:`rank_batch_count`).
    """
    global_batch = world_size * batch_size
    base = start + step * global_batch
    left = remaining - step * global_batch
    if left >= global_batch:
        lo = base + rank * batch_size
        return lo, lo + batch_size
    share, extra = divmod(left, world_size)
    lo = base + rank * share + min(rank, extra)
    return lo, lo + share + (1 if rank < extra else 0)
