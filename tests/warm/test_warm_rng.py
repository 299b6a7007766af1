"""The per-step RNG record of warm restarts: restoring any step's record continues every stream exactly.

The capture re-encodes only the generators that moved, and reads NumPy's generator in place to tell whether it
moved; these tests draw in the patterns that could fool that (nothing drawn, a cached Gaussian handed out
without moving the generator, a reseed) and check each record against the draws that really followed it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
import torch

from goodput.checkpoint.rng import RngCapture, restore_rng_record

# What a step may do to the global generators (each is one "step" of a training loop).
_STEPS: list[Callable[[], object]] = [
    lambda: (random.random(), np.random.rand(3), torch.rand(2)),
    lambda: None,  # draws nothing
    lambda: np.random.randn(),  # draws a pair: one Gaussian is now cached
    lambda: np.random.randn(),  # hands out the cached one: the generator itself does not move
    lambda: None,
    lambda: random.gauss(0.0, 1.0),  # Python's own cached Gaussian
    lambda: torch.randn(3),
    lambda: np.random.seed(7),
    lambda: (random.random(), np.random.standard_normal(3)),  # an odd count: one cached
    lambda: None,
]


def _draws() -> list[float]:
    """The next values of every stream (Gaussians too, so a pending cached one is checked)."""
    return [random.gauss(0.0, 1.0), random.random(), *np.random.randn(3), *np.random.rand(2), *torch.randn(4)]


def _snapshot() -> tuple[object, object, torch.Tensor]:
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _put_back(state: tuple[object, object, torch.Tensor]) -> None:
    random.setstate(state[0])  # type: ignore[arg-type]
    np.random.set_state(state[1])  # type: ignore[arg-type]
    torch.set_rng_state(state[2])


def test_every_steps_record_continues_the_streams_exactly() -> None:
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    capture = RngCapture()
    records, expected = [], []
    for step in _STEPS * 2:
        step()
        records.append(capture.capture())
        live = _snapshot()
        expected.append(_draws())  # what a run that goes on from here draws next
        _put_back(live)
    assert capture._np_address is not None, (
        "NumPy's generator was not read in place: the shortcut is untested"
    )
    assert len({r for r in records}) < len(records), (
        "no step left the states unchanged: reusing NumPy's part is untested"
    )
    random.seed(99), np.random.seed(99), torch.manual_seed(99)  # a replacement's own, unrelated states
    for i, (record, draws) in enumerate(zip(records, expected, strict=True)):
        restore_rng_record(record)
        assert _draws() == draws, f"record {i} does not continue the streams"


def test_a_record_after_states_set_from_outside_holds_them() -> None:
    capture = RngCapture()
    np.random.seed(3)
    np.random.randn()  # one Gaussian cached
    state = np.random.get_state()
    capture.capture()
    np.random.randn()  # handed out: same generator position, nothing cached
    np.random.set_state(state)  # put back from outside: the same position, the Gaussian cached again
    capture.reset()
    record = capture.capture()
    expected = np.random.randn(2).tolist()
    np.random.seed(0)
    restore_rng_record(record)
    assert np.random.randn(2).tolist() == expected


def test_something_else_is_not_read_as_a_record() -> None:
    with pytest.raises(ValueError, match="not an RNG record"):
        restore_rng_record(b"\0" * 64)
