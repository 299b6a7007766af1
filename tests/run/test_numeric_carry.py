"""The numeric guard's words riding DDP's first gradient bucket (goodput.run.numeric.carry): every rank reads
every rank's word bit for bit, the gradients are DDP's own to the bit (also where they are views of DDP's buckets,
whose storage the word grows), a word that found no backward to ride is all-gathered instead, and a NaN in any
bucket of one rank reaches every rank's gradient total, on 2 real gloo ranks."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from goodput.run._comm_hook import add_tap
from goodput.run.numeric.carry import decode, encode
from goodput.run.numeric.grads import BucketCheck
from goodput.run.numeric.rules import FLAG_LOSS, FLAG_LOSS_BAD, decode_row, encode_row
from goodput.testing.dist import run_ranks


def _row(rank: int) -> list[int]:
    """Rank 1's loss is NaN; the fingerprints are large negative and positive int64s."""
    loss = math.nan if rank == 1 else 2.5
    return encode_row(FLAG_LOSS | (FLAG_LOSS_BAD if rank == 1 else 0), loss, -(2**62) + rank, 1e300)


def test_words_survive_a_float_sum_of_every_ranks_payload_bit_for_bit() -> None:
    for dtype, bits in ((torch.float32, 16), (torch.bfloat16, 8), (torch.float16, 8), (torch.float64, 32)):
        payloads = [torch.tensor(encode(_row(r), r, 3, bits), dtype=dtype) for r in range(3)]
        summed = payloads[0] + payloads[1] + payloads[2]
        assert decode(summed.tolist(), 3, bits) == [_row(r) for r in range(3)], dtype


def test_each_payload_holds_the_word_that_boards_else_zeros_whenever_it_was_staged() -> None:
    """A word is written into the payloads when it boards (between steps), or at the first bucket of a dtype
    the carrier had not seen; a backward with no word sends zeros, and a word cancelled before it rode never
    goes."""
    from goodput.run.numeric.carry import Carrier

    carrier = Carrier(1, 2, None)

    def sent(dtype: torch.dtype) -> list[list[int]]:
        payload = carrier.payload(dtype)
        return decode(payload.tolist(), 2, 16 if dtype == torch.float32 else 32)

    zeros = [0] * len(_row(0))
    carrier.board(1, _row(1))
    assert sent(torch.float32) == [zeros, _row(1)]  # staged at its first bucket
    assert sent(torch.float32) == [zeros, zeros]  # a backward with no word
    carrier.board(2, _row(2))  # staged now, for the dtype seen so far
    assert sent(torch.float64) == [zeros, _row(2)]  # a dtype's first bucket
    carrier.board(3, _row(3))
    assert sent(torch.float32) == [zeros, _row(3)]
    assert sent(torch.float64) == [zeros, zeros]  # the word left with the float32 bucket
    carrier.cancel(carrier.board(4, _row(4)))
    assert sent(torch.float32) == [zeros, zeros]


def _two_models(rank: int, world: int) -> tuple[bool, list[list[int]], list[list[int]], float | None]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 300), torch.nn.Tanh(), torch.nn.Linear(300, 4))
    plain = torch.nn.parallel.DistributedDataParallel(net)  # DDP's own hook
    carrying = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net))
    check = BucketCheck.install(carrying, torch.distributed.new_group(backend="gloo"))
    assert check is not None and check.carrier is not None
    x = torch.randn(8, 16) + rank
    word = check.carrier.board(7, _row(rank))
    for model in (plain, carrying):
        model(x).square().mean().backward()
    same = all(
        torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), carrying.parameters(), strict=True)
    )
    rode = word.trip is not None
    rows = word.rows()
    unsent = check.carrier.board(8, _row(rank))  # no backward before it is read: all-gathered
    total = check.take()
    return same and rode and unsent.trip is None, rows, unsent.rows(), total


def test_a_word_rides_the_first_bucket_and_the_gradients_stay_ddps_own() -> None:
    results = run_ranks(_two_models, 2, timeout=120)
    expected = [_row(0), _row(1)]
    for ok, rows, gathered, total in results:
        assert ok, "the gradients differ from DDP's own hook, or the word did not ride the bucket"
        assert rows == expected and gathered == expected
        assert total is not None and math.isfinite(total)
    assert math.isnan(decode_row(results[0][1][1])[1])  # rank 1's NaN loss, as every rank read it


def _in_place(rank: int, world: int) -> tuple[bool, bool]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 300), torch.nn.Tanh(), torch.nn.Linear(300, 4))
    plain = torch.nn.parallel.DistributedDataParallel(net)
    carrying = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net))
    check = BucketCheck.install(carrying, torch.distributed.new_group(backend="gloo"))
    assert check is not None and check.carrier is not None
    storages: list[int] = []

    def tap(bucket: Any, reduce: Any) -> Any:
        future = reduce()  # the bucket's storage as it was all-reduced (grown for the word at its first ride)
        storages.append(bucket.buffer().untyped_storage().data_ptr())
        return future

    add_tap(carrying, "test", tap)
    shared, same = True, True
    for step in range(3):  # the first backward's buckets, then those DDP rebuilds after it
        x = torch.randn(8, 16) + rank
        word = check.carrier.board(step, _row(rank))
        for model in (plain, carrying):
            model.zero_grad()
            model(x).square().mean().backward()
        assert word.trip is not None
        shared = shared and word.trip[1].untyped_storage().data_ptr() == storages[-1]
        same = same and all(
            torch.equal(a.grad, b.grad)
            for a, b in zip(plain.parameters(), carrying.parameters(), strict=True)
        )
        same = same and word.rows() == [_row(r) for r in range(world)]
        check.take()
    return shared, same


def test_the_word_rides_in_the_bucket_s_own_storage_with_no_copy() -> None:
    for shared, same in run_ranks(_in_place, 2, timeout=120):
        assert shared, "the word's elements are not in the bucket's own storage: the bucket was copied"
        assert same, "the gradients or the words differ"


def _every_bucket(rank: int, world: int, as_view: bool) -> tuple[list[int], list[float], bool]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(16, 300),
        torch.nn.Tanh(),
        torch.nn.Linear(300, 300),
        torch.nn.Tanh(),
        torch.nn.Linear(300, 4),
    )
    kw = {"bucket_cap_mb": 0.1, "gradient_as_bucket_view": as_view}  # two buckets from the second backward on
    plain = torch.nn.parallel.DistributedDataParallel(net, **kw)
    carrying = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net), **kw)
    check = BucketCheck.install(carrying, torch.distributed.new_group(backend="gloo"))
    assert check is not None
    buckets: list[int] = []
    add_tap(carrying, "test", lambda bucket, reduce: (buckets.append(bucket.index()), reduce())[1])
    first = carrying.module[0].weight  # the first layer: in the last bucket once DDP rebuilt them
    poisoned = {"step": -1}
    first.register_hook(
        lambda g: g.index_fill(0, torch.tensor([3]), math.nan) if poisoned["step"] == 2 else g
    )
    counts, totals, same = [], [], True
    for step in range(4):
        poisoned["step"] = step if rank == 1 else -1
        buckets.clear()
        x = torch.randn(8, 16) + rank
        for model in (plain, carrying):
            model.zero_grad()
            model(x).square().mean().backward()
        counts.append(len(buckets))
        total = check.take()
        assert total is not None
        totals.append(total)
        if step != 2:
            same = same and all(
                torch.equal(a.grad, b.grad)
                for a, b in zip(plain.parameters(), carrying.parameters(), strict=True)
            )
    return counts, totals, same


@pytest.mark.parametrize("as_view", [False, True], ids=["copied-grads", "grads-as-bucket-views"])
def test_a_nan_in_any_bucket_of_one_rank_reaches_every_ranks_total(as_view: bool) -> None:
    for counts, totals, same in run_ranks(_every_bucket, 2, as_view, timeout=120):
        assert counts[2] >= 2, f"DDP made one bucket only ({counts}): the test does not reach a later bucket"
        assert same, "the gradients differ from DDP's own hook's"
        assert math.isnan(totals[2]), totals  # rank 1's NaN, in its last bucket, on both ranks
        assert all(math.isfinite(t) for i, t in enumerate(totals) if i != 2), totals
