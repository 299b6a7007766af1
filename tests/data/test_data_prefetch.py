"""DevicePrefetcher: the CPU thread path keeps the loader's exactly-once position; the CUDA path on a GPU."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
import torch

from goodput import ConfigError, DevicePrefetcher, ResumableLoader
from tests.helpers import data as _data
from tests.helpers.stateful import interrupt_snapshot_restore_compare

N, B = 37, 4


@pytest.mark.parametrize("num_workers", [0, 2])
def test_prefetcher_resumes_exactly(num_workers: int) -> None:
    def make() -> ResumableLoader:
        return ResumableLoader(_data.Squares(N), batch_size=B, seed=2, num_workers=num_workers)

    before, rest = interrupt_snapshot_restore_compare(
        make, lambda loader: DevicePrefetcher(loader, "cpu", depth=3), 4
    )
    assert sorted(i for b in before + rest for i in _data.ids(b)) == list(range(N))


def test_only_batches_the_loop_received_count_as_consumed() -> None:
    dataset = _data.Watched(N)
    loader = ResumableLoader(dataset, batch_size=B)
    batches = iter(DevicePrefetcher(loader, "cpu", depth=3))
    for _ in range(3):
        next(batches)
    assert dataset.wait_fetched(6 * B)  # the thread loads ahead of the loop (3 queued, 1 in hand) ...
    assert loader.consumed == 3 * B  # ... but the position counts what the loop received
    assert len(loader.fetch_seconds) == 3  # and the loop's waits went to the loader's fetch_seconds
    state = json.loads(json.dumps(loader.state_dict()))
    batches.close()  # stops the thread
    assert not any(t.name == "goodput-prefetch" for t in threading.enumerate())
    resumed = ResumableLoader(_data.Watched(N), batch_size=B)
    resumed.load_state_dict(state)
    assert resumed.consumed == 3 * B


def test_prefetcher_over_a_plain_iterable_and_its_errors() -> None:
    def broken() -> Iterator[torch.Tensor]:
        yield torch.zeros(2)
        raise RuntimeError("storage went away")

    prefetcher = DevicePrefetcher(broken(), "cpu")
    batches = iter(prefetcher)
    assert torch.equal(next(batches), torch.zeros(2))
    with pytest.raises(RuntimeError, match="storage went away"):
        next(batches)
    assert len(prefetcher.fetch_seconds) == 1
    with pytest.raises(ConfigError, match="depth must be a positive integer"):
        DevicePrefetcher([], "cpu", depth=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prefetcher_copies_every_batch_in_order() -> None:
    loader = ResumableLoader(_data.Squares(N), batch_size=B, seed=4, pin_memory=True, num_workers=2)
    expected = list(ResumableLoader(_data.Squares(N), batch_size=B, seed=4))
    got = []
    for batch in DevicePrefetcher(loader, "cuda"):
        assert batch.is_cuda
        got.append((batch * 1).cpu())  # compute on the default stream right after the hand-over
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert loader.epoch == 1 and len(loader.fetch_seconds) == len(expected)
