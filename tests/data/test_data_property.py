"""Property: whatever the crash points and world sizes, each epoch's consumed samples are exactly the dataset.

A job of ``world`` ranks (one ResumableLoader each, stepping in lockstep) runs some steps, then crashes: some
ranks may already have received the next batch, which is lost with them. The job restarts on another world
size from the last saved position (JSON), and so on; a last attempt runs to the end of epoch 1. The order is
the global shuffle or the shard-aware one. The samples
the training loops received before each saved position, per epoch, must be the dataset exactly once.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from goodput import ResumableLoader
from tests.helpers import data as _data

_END = object()


def _loader(n: int, batch: int, rank: int, world: int, sharded: bool) -> ResumableLoader:
    if not sharded:
        return ResumableLoader(_data.Squares(n), batch_size=batch, seed=11, rank=rank, world_size=world)
    shards = [min(5, n - start) for start in range(0, n, 5)]
    return ResumableLoader(
        _data.Sharded(shards), batch_size=batch, seed=11, rank=rank, world_size=world, shard_window=2
    )


def _attempt(
    n: int,
    batch: int,
    world: int,
    state: dict[str, Any] | None,
    steps: int | None,
    crash_ranks: list[int],
    sharded: bool,
) -> tuple[dict[int, list[int]], dict[str, Any]]:
    """Run ``steps`` lockstep steps (None: to the end of epoch 1); return samples by epoch and the saved state."""
    loaders = [_loader(n, batch, r, world, sharded) for r in range(world)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
    received: dict[int, list[int]] = defaultdict(list)
    epoch = loaders[0].epoch
    batches = [iter(loader) for loader in loaders]
    done = 0
    while (steps is None and loaders[0].epoch < 2) or (steps is not None and done < steps):
        got = [next(it, _END) for it in batches]
        if all(b is _END for b in got):  # every rank finished the epoch: the next iteration is the next epoch
            assert len({loader.epoch for loader in loaders}) == 1
            epoch = loaders[0].epoch
            batches = [iter(loader) for loader in loaders]
            continue
        received[epoch] += [i for b in got if b is not _END for i in _data.ids(b)]
        done += 1
    saved = json.loads(json.dumps(loaders[0].state_dict()))  # the checkpoint at this step boundary
    for rank in crash_ranks:  # these ranks receive one more batch, then the job dies before saving
        if rank < world:
            next(batches[rank], None)
    return received, saved


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    batch=st.integers(1, 7),
    attempts=st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 25), st.lists(st.integers(0, 3), max_size=2)),
        min_size=1,
        max_size=5,
    ),
    last_world=st.integers(1, 4),
    sharded=st.booleans(),
)
@example(n=37, batch=4, attempts=[(2, 3, [1]), (1, 5, [0])], last_world=2, sharded=False)  # 2 -> 1 -> 2 ranks
def test_each_epoch_is_the_dataset_exactly_once(
    n: int, batch: int, attempts: list[tuple[int, int, list[int]]], last_world: int, sharded: bool
) -> None:
    by_epoch: dict[int, list[int]] = defaultdict(list)
    state: dict[str, Any] | None = None
    for world, steps, crash_ranks in attempts:
        received, state = _attempt(n, batch, world, state, steps, crash_ranks, sharded)
        for epoch, samples in received.items():
            by_epoch[epoch] += samples
    received, state = _attempt(n, batch, last_world, state, None, [], sharded)
    for epoch, samples in received.items():
        by_epoch[epoch] += samples
    assert state["epoch"] >= 2
    for epoch in range(2):
        assert sorted(by_epoch[epoch]) == list(range(n)), f"epoch {epoch}"
