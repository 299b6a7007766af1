"""The one codec and transport of a training state between processes (goodput.checkpoint.transfer): a full
training state (model, optimizer, scheduler, data position, RNG states of torch, NumPy and Python, nested
metadata) comes back bit for bit; changed bytes are refused; nothing is ever unpickled."""

from __future__ import annotations

import io
import pickle
import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xxhash

from goodput.checkpoint import TrainingState
from goodput.checkpoint.transfer import Inbox, broadcast_state, decode, encode, receive, send
from goodput.data import ResumableLoader
from goodput.errors import CheckpointCorrupt
from goodput.testing.dist import run_ranks
from tests.helpers.planted import Planted


def _full_state(seed: int) -> dict[str, Any]:
    """Everything a hand-over carries, after a few real steps, with the awkward values metadata can hold."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = ResumableLoader(
        list(range(64)), batch_size=4, seed=7, rank=0, world_size=1
    )  # the same on any rank
    batches = iter(loader)
    for _ in range(3):
        x = torch.stack([torch.full((4,), float(v)) for v in next(batches)])
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    live = TrainingState(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
    return {
        **live.live_state_dict(loader=loader.state_dict()),
        "position": loader.state_dict(),
        "rng": {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "numpy_dict": np.random.get_state(legacy=False),
            "pcg64": np.random.default_rng(seed).bit_generator.state,  # 128-bit Python ints
            "python": random.getstate(),
        },
        "meta": {
            1: [None, True, False, 0, -(2**70), 1.5, -0.0, float("inf"), float("nan"), "é✓"],
            2.5: ("a", (1, [2, {"deep": ()}]), []),
            None: {
                "bytes": b"\x00\xffraw",
                "empty": b"",
                "np": [np.float32(0.1), np.int64(-3), np.bool_(True)],
            },
            "tensors": [
                torch.tensor(3),
                torch.empty(0, 5),
                torch.arange(12, dtype=torch.bfloat16).reshape(3, 4).t(),  # not contiguous
                torch.tensor([True, False]),
                torch.randint(0, 255, (7,), dtype=torch.uint8),
            ],
        },
    }


def _assert_same(a: Any, b: Any, path: str = "") -> None:
    """Equal in type, structure and every bit (NaN and -0.0 included); every mapping comes back a dict."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert a.reshape(-1).view(torch.uint8).tolist() == b.reshape(-1).view(torch.uint8).tolist(), path
    elif isinstance(a, np.ndarray | np.generic):
        assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes()), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            _assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), path
    else:
        assert a == b, path


def test_a_full_training_state_round_trips_bit_for_bit_and_its_rng_draws_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = _full_state(seed=0)
    blob = encode(state).to_bytes()

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("decoding a state reached pickle")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    back = decode(blob)
    monkeypatch.undo()
    _assert_same(back, state)

    rng = back["rng"]
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    drawn = (torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random())
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    assert drawn == (torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random())


@pytest.mark.parametrize("where", ["envelope", "header", "data", "last byte"])
def test_a_changed_byte_is_refused_by_the_checksum(where: str) -> None:
    message = encode(_full_state(seed=0))
    blob = bytearray(message.to_bytes())
    at = {"envelope": 20, "header": 30 + 24, "data": 24 + len(message.head) + 5, "last byte": len(blob) - 1}
    blob[at[where]] ^= 0x01
    with pytest.raises(CheckpointCorrupt, match="checksum"):
        decode(blob)


def test_a_state_without_tensors_round_trips() -> None:
    """A marker or an error travels as a state of plain values only (no tensor bytes at all)."""
    state = {"error": "unreadable", "bytes": 12, "nested": {"x": [1.0, None]}}
    assert decode(encode(state).to_bytes()) == state


def test_a_truncated_message_is_refused_with_its_lengths() -> None:
    blob = encode({"w": torch.ones(100)}).to_bytes()
    with pytest.raises(CheckpointCorrupt, match=f"holds {len(blob) - 24 - 1} bytes, its envelope says"):
        decode(blob[:-1])
    with pytest.raises(CheckpointCorrupt, match="shorter than its envelope"):
        decode(blob[:10])


def test_a_payload_that_would_run_code_can_be_neither_encoded_nor_decoded(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(TypeError, match="cannot hold a Planted"):
        encode({"model": {}, "extra": Planted(str(marker))})
    buf = io.BytesIO()
    torch.save(
        {"extra": Planted(str(marker))}, buf
    )  # what a sender other than goodput's could put on the wire
    for payload in (pickle.dumps(Planted(str(marker))), buf.getvalue()):
        with pytest.raises(CheckpointCorrupt):
            decode(payload)
        # even behind an envelope whose lengths and checksum are right, the bytes are not a state part
        sealed = struct.pack("<QQQ", len(payload), 0, xxhash.xxh3_64_intdigest(payload)) + payload
        with pytest.raises(CheckpointCorrupt, match="not a goodput state part"):
            decode(sealed)
    assert not marker.exists()


def _ranks_hand_over(rank: int, world: int) -> list[bool | str]:
    """Rank 0 broadcasts a full state, then sends one to rank 1 twice through a reused inbox; every receiver
    compares with the same state built locally. Then rank 0 broadcasts a state the codec cannot express: every
    rank raises (none waits for it)."""
    expected = _full_state(seed=0)
    got = broadcast_state(expected if rank == 0 else _full_state(seed=1) and None, 0)
    _assert_same(got, expected)
    results: list[bool | str] = [True]
    inbox = Inbox()
    for seed in (2, 3):
        if rank == 0:
            send(encode(_full_state(seed)), 1).wait()
        elif rank == 1:
            _assert_same(decode(receive(0, None, inbox)), _full_state(seed))
            results.append(True)
    try:
        broadcast_state({"model": {"w": torch.ones(2)}, "odd": {1, 2}} if rank == 0 else None, 0)
    except TypeError as err:
        results.append(str(err))
    return results


@pytest.mark.slow
def test_a_state_broadcast_and_sent_between_processes_arrives_bit_for_bit() -> None:
    results = run_ranks(_ranks_hand_over, 3)
    assert [r[:-1] for r in results] == [[True], [True, True, True], [True]]
    refused = "the state of rank 0 cannot be sent: a training state cannot hold a set"
    assert all(str(r[-1]).startswith(refused) for r in results), results
