"""ResumableLoader: exact resume across workers and JSON, O(1) resume, hooks, fetch_seconds, errors."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from goodput import ConfigError, DataError, FingerprintMismatch, ResumableLoader, sample_seed
from tests.helpers import data as _data
from tests.helpers.stateful import interrupt_snapshot_restore_compare

N, B = 37, 4  # 10 batches an epoch, the last one partial


def _two_epochs(loader: ResumableLoader) -> Iterator[Any]:
    """Epochs 0 and 1, from wherever the loader's position is (each iter() runs the rest of an epoch)."""
    while loader.epoch < 2:
        yield from loader


@pytest.mark.parametrize(
    ("num_workers", "persistent"), [(0, False), (2, False), (2, True)], ids=["main", "workers", "persistent"]
)
@pytest.mark.parametrize("interrupt_at", [3, 13])  # in the first epoch, in the second
def test_interrupt_snapshot_restore_compare(num_workers: int, persistent: bool, interrupt_at: int) -> None:
    def make() -> ResumableLoader:
        return ResumableLoader(
            _data.Squares(N), batch_size=B, seed=7, num_workers=num_workers, persistent_workers=persistent
        )

    before, rest = interrupt_snapshot_restore_compare(make, _two_epochs, interrupt_at)
    samples = [i for batch in before + rest for i in _data.ids(batch)]
    assert sorted(samples[:N]) == list(range(N))  # each epoch holds every sample exactly once
    assert sorted(samples[N:]) == list(range(N))
    assert samples[:N] != samples[N:]  # and each epoch has its own order


def test_drop_last_resume_keeps_full_batches() -> None:
    def make() -> ResumableLoader:
        return ResumableLoader(_data.Squares(N), batch_size=B, drop_last=True)

    before, rest = interrupt_snapshot_restore_compare(make, _two_epochs, 4)
    assert [len(b) for b in before + rest] == [B] * 18
    assert len({i for b in (before + rest)[:9] for i in _data.ids(b)}) == 36  # epoch 0: no repeats


def test_ranks_split_each_step_and_agree_on_the_position() -> None:
    loaders = [ResumableLoader(_data.Squares(N), batch_size=B, rank=r, world_size=2) for r in range(2)]
    seen: list[int] = []
    for b0, b1 in zip(*loaders, strict=True):
        seen += _data.ids(b0) + _data.ids(b1)
        if loaders[0].epoch == 0:
            assert loaders[0].state_dict() == loaders[1].state_dict()
    assert sorted(seen) == list(range(N))
    assert loaders[0].state_dict() == loaders[1].state_dict()
    assert loaders[0].state_dict()["epoch"] == 1
    assert len(loaders[0]) == 5  # 4 full steps of 8, then 5 left: 3 for rank 0, 2 for rank 1


def test_world_size_change_continues_the_epoch() -> None:
    two = [ResumableLoader(_data.Squares(N), batch_size=B, rank=r, world_size=2, seed=3) for r in range(2)]
    its = [iter(loader) for loader in two]
    seen = [i for _ in range(2) for it in its for i in _data.ids(next(it))]
    state = json.loads(json.dumps(two[1].state_dict()))
    assert state["consumed"] == 16 and state["world_size"] == 2
    one = ResumableLoader(_data.Squares(N), batch_size=B, world_size=1, seed=3)
    one.load_state_dict(state)
    seen += [i for batch in one for i in _data.ids(batch)]
    assert sorted(seen) == list(range(N))


def test_set_epoch_keeps_a_restored_position_and_resets_otherwise() -> None:
    loader = ResumableLoader(_data.Squares(N), batch_size=B)
    loader.load_state_dict({**loader.state_dict(), "epoch": 2, "consumed": 12})
    loader.set_epoch(2)
    assert (loader.epoch, loader.consumed) == (2, 12)
    assert len(list(loader)) == 7
    assert (loader.epoch, loader.consumed) == (3, 0)
    loader.set_epoch(5)
    assert (loader.epoch, loader.consumed) == (5, 0)


def test_resume_at_sample_one_million_replays_nothing() -> None:
    n, big = 2_000_000, 250_000
    reference = ResumableLoader(_data.Batched(n), batch_size=big, seed=1, collate_fn=_data.keep)
    batches = list(itertools.islice(reference, 5))  # really consumes 1,000,000 samples, then one batch more
    saved = json.dumps(batches and reference.state_dict())
    assert json.loads(saved)["consumed"] == 1_250_000

    dataset = _data.Batched(n)
    resumed = ResumableLoader(dataset, batch_size=32, seed=1, collate_fn=_data.keep)
    state = {**json.loads(saved), "consumed": 1_000_000}
    resumed.load_state_dict(state)
    first = next(iter(resumed))
    assert first.tolist() == batches[4][:32].tolist()  # the samples right after the first 1,000,000
    assert dataset.calls == [32]  # one batch fetched: nothing replayed
    assert len(json.dumps(resumed.state_dict())) < 4096


def test_state_is_small_json_with_constant_keys() -> None:
    loader = ResumableLoader(_data.Squares(N), batch_size=B, fingerprint="corpus-v1")
    keys = set(loader.state_dict())
    next(iter(loader))
    state = loader.state_dict()
    assert set(state) == keys == {"format", "seed", "epoch", "consumed", "world_size", "fingerprint", "skips"}
    assert state["fingerprint"]["identity"] == "corpus-v1"
    assert len(json.dumps(state)) < 4096


def test_fetch_seconds_are_the_loops_wait_per_batch() -> None:
    delay = 0.02  # per sample, so a batch of 2 takes at least 0.04 s
    loader = ResumableLoader(_data.Slow(6, delay), batch_size=2)
    for _ in loader:
        pass
    waits = loader.fetch_seconds.values
    assert len(waits) == 3 and min(waits) >= 2 * delay
    assert loader.last_fetch_seconds == waits[-1]
    summary = loader.fetch_seconds.summary()
    assert summary["count"] == 3 and summary["sum"] == pytest.approx(sum(waits))
    assert summary["p50"] <= summary["p95"] <= summary["max"] == max(waits)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_per_sample_seeds_do_not_depend_on_workers_ranks_or_epochs_resumed(num_workers: int) -> None:
    one = ResumableLoader(_data.Seeded(10), batch_size=3, seed=5, num_workers=num_workers)
    pairs = {int(i): int(s) for batch in one for i, s in batch.tolist()}
    assert pairs == {i: sample_seed(5, 0, i) for i in range(10)}
    ranks = [ResumableLoader(_data.Seeded(10), batch_size=3, seed=5, rank=r, world_size=2) for r in range(2)]
    assert {int(i): int(s) for loader in ranks for batch in loader for i, s in batch.tolist()} == pairs
    assert {int(i): int(s) for batch in one for i, s in batch.tolist()} != pairs  # epoch 1: other seeds


def test_prefetch_hook_announces_the_upcoming_order() -> None:
    dataset = _data.Prefetching(N)
    loader = ResumableLoader(dataset, batch_size=B, lookahead=3)
    delivered: list[int] = []
    for batch in loader:
        delivered += _data.ids(batch)
        announced = sum(len(a) for a in dataset.announced)
        assert announced >= min(N, len(delivered) + 2 * B)  # always at least two batches ahead
    assert len(dataset.announced[0]) == 3 * B
    assert [i for a in dataset.announced for i in a] == delivered

    resumed = _data.Prefetching(N)
    again = ResumableLoader(resumed, batch_size=B, lookahead=3)
    again.load_state_dict({**loader.state_dict(), "epoch": 0, "consumed": 8})
    assert [i for b in again for i in _data.ids(b)] == delivered[8:]
    assert [i for a in resumed.announced for i in a] == delivered[8:]


def test_shard_window_needs_shard_sizes() -> None:
    with pytest.raises(ConfigError, match="shard_window needs a dataset with shard_sizes"):
        ResumableLoader(_data.Squares(N), batch_size=B, shard_window=2)
    sharded = ResumableLoader(_data.Sharded([10, 10, 10, 7]), batch_size=B, shard_window=2)
    assert sorted(i for b in sharded for i in _data.ids(b)) == list(range(N))
    assert sharded.state_dict()["fingerprint"]["order"].startswith("shards:window=2")


@pytest.mark.parametrize("batch_size", [0, -3])
def test_bad_batch_size(batch_size: int) -> None:
    with pytest.raises(ConfigError, match=f"batch_size must be a positive integer, got {batch_size}"):
        ResumableLoader(_data.Squares(N), batch_size=batch_size)


def test_empty_dataset() -> None:
    with pytest.raises(ConfigError, match="the dataset is empty"):
        ResumableLoader(_data.Squares(0), batch_size=B)


def test_iterable_dataset_is_refused() -> None:
    with pytest.raises(ConfigError, match="map-style dataset with __len__"):
        ResumableLoader(iter(range(5)), batch_size=B)


def test_bad_rank_and_worker_options() -> None:
    with pytest.raises(ConfigError, match=r"rank must be in \[0, 2\)"):
        ResumableLoader(_data.Squares(N), batch_size=B, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="persistent_workers=True needs num_workers > 0"):
        ResumableLoader(_data.Squares(N), batch_size=B, persistent_workers=True)


def test_fingerprint_mismatch_says_what_differs() -> None:
    saved = ResumableLoader(_data.Squares(N, fingerprint="a"), batch_size=B).state_dict()
    other = ResumableLoader(_data.Squares(N + 3, fingerprint="b"), batch_size=B)
    with pytest.raises(FingerprintMismatch, match="size 40 != saved 37; identity 'b' != saved 'a'"):
        other.load_state_dict(saved)
    reordered = ResumableLoader(_data.Squares(N, fingerprint="a"), batch_size=B, shuffle=False)
    with pytest.raises(FingerprintMismatch, match="order 'sequential' != saved 'shuffle'"):
        reordered.load_state_dict(saved)


def test_allowed_fingerprint_mismatch_warns_and_resumes() -> None:
    saved = {**ResumableLoader(_data.Squares(N), batch_size=B, fingerprint="a").state_dict(), "consumed": 8}
    other = ResumableLoader(_data.Squares(N), batch_size=B, fingerprint="b", allow_fingerprint_mismatch=True)
    with pytest.warns(UserWarning, match="identity 'b' != saved 'a'"):
        other.load_state_dict(saved)
    assert other.consumed == 8


def test_newer_state_format_is_refused() -> None:
    loader = ResumableLoader(_data.Squares(N), batch_size=B)
    with pytest.raises(ConfigError, match="format version 3, newer than this goodput's 2: upgrade goodput"):
        loader.load_state_dict({**loader.state_dict(), "format": 3})
    with pytest.raises(ConfigError, match="lacks consumed"):
        loader.load_state_dict({"format": 1, "seed": 0, "epoch": 0, "world_size": 1, "fingerprint": {}})


def test_changing_the_position_while_iterating_is_refused() -> None:
    loader = ResumableLoader(_data.Squares(N), batch_size=B)
    batches = iter(loader)
    next(batches)
    loader.set_epoch(4)
    with pytest.raises(ConfigError, match="during an iteration"):
        next(batches)


def test_close_ends_the_workers_and_the_loader_goes_on_from_its_position_when_iterated_again() -> None:
    """``close()`` (a warm restart closes the failed generation's loaders) shuts the persistent workers down
    at once; the abandoned iterator raises rather than ending the epoch, and iterating again continues with the
    samples not yet received."""
    import multiprocessing

    loader = ResumableLoader(_data.Squares(N), batch_size=B, seed=3, num_workers=2, persistent_workers=True)
    first = iter(loader)
    received = [i for _ in range(3) for i in _data.ids(next(first))]
    assert len(multiprocessing.active_children()) == 2
    loader.close()
    assert multiprocessing.active_children() == []
    with pytest.raises(DataError, match="closed"):
        next(first)
    received += [i for batch in loader for i in _data.ids(batch)]
    assert sorted(received) == list(range(N)) and loader.epoch == 1
