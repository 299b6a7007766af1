"""The pure sample order: a permutation per (seed, epoch, n), shard-local windows, the split over ranks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.data import sample_seed
from goodput.data.order import EpochOrder, rank_batch_count, rank_batch_range, sample_seeds


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 3000), seed=st.integers(0, 2**40), epoch=st.integers(0, 1000))
def test_every_order_is_a_permutation(n: int, seed: int, epoch: int) -> None:
    order = EpochOrder(seed=seed, epoch=epoch, size=n).at(np.arange(n))
    assert np.array_equal(np.sort(order), np.arange(n))


def test_order_is_a_pure_function_of_seed_epoch_and_size() -> None:
    n = 5000
    a = EpochOrder(seed=1, epoch=0, size=n).at(np.arange(n))
    assert np.array_equal(a, EpochOrder(seed=1, epoch=0, size=n).at(np.arange(n)))
    assert np.array_equal(a[1234:1300], EpochOrder(seed=1, epoch=0, size=n).at(np.arange(1234, 1300)))
    for other in (EpochOrder(seed=1, epoch=1, size=n), EpochOrder(seed=2, epoch=0, size=n)):
        assert np.mean(other.at(np.arange(n)) == a) < 0.01  # different epochs/seeds: unrelated orders


def test_order_is_well_mixed() -> None:
    n = 100_000
    order = EpochOrder(seed=0, epoch=0, size=n).at(np.arange(n)).astype(np.float64)
    assert abs(np.corrcoef(np.arange(n), order)[0, 1]) < 0.02  # no trend left from the dataset order
    first_tenth = order[: n // 10]
    counts = np.histogram(first_tenth, bins=10, range=(0, n))[0]
    assert counts.min() > 0.8 * n / 100  # the first tenth draws evenly from the whole dataset
    assert np.array_equal(EpochOrder(seed=0, epoch=0, size=9, shuffle=False).at(np.arange(9)), np.arange(9))


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=25),
    window=st.integers(1, 6),
    epoch=st.integers(0, 50),
)
def test_shard_order_is_a_permutation_that_reads_one_window_at_a_time(
    sizes: list[int], window: int, epoch: int
) -> None:
    n = sum(sizes)
    order = EpochOrder(seed=3, epoch=epoch, size=n, shard_sizes=sizes, window=window).at(np.arange(n))
    assert np.array_equal(np.sort(order), np.arange(n))
    shard_of = np.repeat(np.arange(len(sizes)), sizes)[order]  # the shard each position reads
    seen: set[int] = set()
    start = 0
    while start < n:  # consecutive windows: each reads `window` new shards, never one seen before
        shards = set()
        while start < n and (len(shards) < window or int(shard_of[start]) in shards):
            shards.add(int(shard_of[start]))
            start += 1
        assert not shards & seen
        seen |= shards
    assert len(seen) == len(sizes)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 500),
    consumed_share=st.floats(0, 1),
    world=st.integers(1, 8),
    batch=st.integers(1, 16),
    drop_last=st.booleans(),
)
def test_ranks_split_the_rest_of_an_epoch_exactly(
    n: int, consumed_share: float, world: int, batch: int, drop_last: bool
) -> None:
    start = min(int(consumed_share * n), n)
    remaining = n - start
    positions: list[int] = []
    for rank in range(world):
        for step in range(rank_batch_count(remaining, world, rank, batch, drop_last=drop_last)):
            lo, hi = rank_batch_range(start, step, world, rank, batch, remaining)
            assert 0 < hi - lo <= batch
            positions += range(lo, hi)
    kept = remaining - remaining % (world * batch) if drop_last else remaining
    assert sorted(positions) == list(range(start, start + kept))
    counts = [rank_batch_count(remaining, world, r, batch, drop_last=drop_last) for r in range(world)]
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)


def test_sample_seeds_are_pure_and_distinct() -> None:
    seeds = sample_seeds(7, 3, np.arange(10_000))
    assert len(set(seeds.tolist())) == 10_000 and seeds.min() >= 0
    assert sample_seed(7, 3, 1234) == int(seeds[1234])
    assert sample_seed(7, 4, 1234) != sample_seed(7, 3, 1234) != sample_seed(8, 3, 1234)
