"""Capture and restore every random number generator a training step can draw from, in two forms.

* For checkpoints, :func:`capture_rng` gives a small JSON-able dict (python ``random``, numpy's global
  generator, torch's CPU generator and every CUDA device's), so it travels through a checkpoint without
  pickling and is restored by ``torch.load(weights_only=True)`` or plain JSON (:func:`restore_rng`).
* For warm restarts, :class:`RngCapture` packs the same states into one compact binary record after every
  step (its cost is paid on every step, so it copies raw bytes and re-reads NumPy's generator only when it
  moved); :func:`restore_rng_record` puts them back in a replacement rank.

A rank that the saving run did not have (a job resumed on more ranks) has no saved state to restore; its RNGs
are seeded by :func:`seed_new_rank` from :func:`rank_seed` ``(seed, rank, step)``: a pure function of the run's
seed, the rank and the restored step, so a rank that joins at the same step of the same run always draws the
same streams, and two new ranks never share one.

The binary record: ``GRNG`` then ``<idiid`` (Python version, gauss_next or NaN, NumPy pos, has_gauss, cached
gaussian), Python's 625 words (``<Q``), NumPy's 624 key words (``<I``), torch's state (``<I`` length first),
then the CUDA states (``<I`` count, each with its ``<I`` length). NumPy's MT19937 key and position are read in
place through the bit generator's documented ``ctypes`` address (checked once against ``get_state()``, unused
when they disagree); the one state this cannot tell apart is ``np.random.set_state`` to the very key and
position of the previous capture with a different pending Gaussian, which :meth:`RngCapture.reset` (called
after goodput sets the states itself) covers.
"""

from __future__ import annotations

import array
import base64
import ctypes
import math
import random
import struct
from typing import Any

import numpy as np
import torch

__all__ = ["RngCapture", "capture_rng", "rank_seed", "restore_rng", "restore_rng_record", "seed_new_rank"]

_M64 = (1 << 64) - 1


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def capture_rng() -> dict[str, Any]:
    """The state of every RNG of this process, as a JSON-able dict."""
    version, internal, gauss = random.getstate()
    np_kind, np_key, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [np_kind, [int(x) for x in np_key], int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": _b64(torch.get_rng_state()),
        "cuda": [],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put every RNG back to a state returned by :func:`capture_rng`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


def _splitmix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def rank_seed(seed: int, rank: int, step: int) -> int:
    """The seed of a new rank's RNGs: splitmix64 over (seed, rank, step), a non-negative int below 2**63.

    Args:
        seed: the run's seed (``TrainingState(seed=...)``, else the data loader's seed, else 0).
        rank: the new rank.
        step: the step the run resumes from.
    """
    acc = 0x6E6577_72616E6B  # "newrank": keeps these seeds apart from other uses of the same triple
    for part in (seed, rank, step):
        acc = _splitmix(acc ^ (int(part) & _M64))
    return acc >> 1


def seed_new_rank(seed: int, rank: int, step: int) -> int:
    """Seed python's, numpy's and torch's (CPU and every CUDA device's) generators from :func:`rank_seed`.

    Returns:
        The seed used (python and torch get it whole, numpy its low 32 bits).
    """
    value = rank_seed(seed, rank, step)
    random.seed(value)
    np.random.seed(value & 0xFFFFFFFF)
    torch.manual_seed(value)  # also seeds every CUDA device
    return value


# ---- the binary record of warm restarts ----------------------------------------------------------------------
_MAGIC = b"GRNG"
_HEAD = struct.Struct("<4sidiid")
_LEN = struct.Struct("<I")
_PY_WORDS = 625  # MT19937's 624 words and its position, as random.getstate() gives them
_NP_KEY = 624 * 4
_NP_RAW = _NP_KEY + 4  # numpy's mt19937_state: uint32 key[624]; int pos


class RngCapture:
    """Captures this process's RNG states as bytes, re-encoding only what changed since the last call."""

    def __init__(self) -> None:
        self._np_raw: bytes | None = None  # the directly read key and pos the cached NumPy part was taken at
        self._np_head: tuple[int, int, float] = (0, 0, 0.0)
        self._np_key = b""
        self._np_address: tuple[Any, int] | None = None  # (bit generator, its state's address) once checked
        self._np_checked: Any = None  # the bit generator the direct read was checked (or refused) for

    def reset(self) -> None:
        """Forget the previous capture (after the states were set from outside): the next one reads everything."""
        self._np_raw = None

    def capture(self) -> bytes:
        """Every RNG's state now, as one record (see the module docstring)."""
        version, internal, gauss = random.getstate()
        self._numpy()
        pos, has_gauss, cached = self._np_head
        parts = [
            _HEAD.pack(_MAGIC, version, math.nan if gauss is None else gauss, pos, has_gauss, cached),
            array.array("Q", internal).tobytes(),  # packing is cheaper than comparing 625 ints
            self._np_key,
        ]
        torch_state = torch.get_rng_state().numpy().tobytes()
        parts += [_LEN.pack(len(torch_state)), torch_state]
        cuda: list[bytes] = []
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            cuda = [t.numpy().tobytes() for t in torch.cuda.get_rng_state_all()]
        parts.append(_LEN.pack(len(cuda)))
        for state in cuda:
            parts += [_LEN.pack(len(state)), state]
        return b"".join(parts)

    def _numpy(self) -> None:
        raw = self._np_direct()
        if raw is not None and raw == self._np_raw and self._np_head[1] == 0:
            return  # the generator did not move and no cached gaussian is pending: the same state
        _, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
        self._np_key = np.asarray(key, dtype=np.uint32).tobytes()
        self._np_head = (int(pos), int(has_gauss), float(cached))
        self._np_raw = raw

    def _np_direct(self) -> bytes | None:
        """NumPy's global MT19937 key and position read in place (None: not available or not trusted)."""
        generator = np.random.mtrand.get_bit_generator()
        if self._np_address is not None and self._np_address[0] is generator:
            return ctypes.string_at(self._np_address[1], _NP_RAW)
        if self._np_checked is generator:
            return None  # checked before, and refused
        self._np_checked, self._np_address = generator, None
        try:
            address = int(generator.ctypes.state_address)
            _, key, pos, _, _ = np.random.get_state(legacy=True)
        except (AttributeError, TypeError, ValueError):
            return None
        raw = ctypes.string_at(address, _NP_RAW)
        expected = np.asarray(key, dtype=np.uint32).tobytes() + struct.pack("<i", int(pos))
        if raw != expected:
            return None
        self._np_address = (generator, address)
        return raw


def restore_rng_record(record: bytes) -> None:
    """Put every RNG back to the state ``record`` (from :meth:`RngCapture.capture`) holds.

    Raises:
        ValueError: when ``record`` is not such a record.
    """
    magic, version, gauss, pos, has_gauss, cached = _HEAD.unpack_from(record)
    if magic != _MAGIC:
        raise ValueError("not an RNG record")
    at = _HEAD.size + _PY_WORDS * 8
    internal = array.array("Q")
    internal.frombytes(record[_HEAD.size : at])
    random.setstate((version, tuple(internal), None if math.isnan(gauss) else gauss))
    np.random.set_state(
        ("MT19937", np.frombuffer(record[at : at + _NP_KEY], dtype=np.uint32), pos, has_gauss, cached)
    )
    at += _NP_KEY
    cpu, at = _chunk(record, at)
    torch.set_rng_state(torch.frombuffer(bytearray(cpu), dtype=torch.uint8))
    (count,) = _LEN.unpack_from(record, at)
    at += _LEN.size
    cuda = []
    for _ in range(count):
        state, at = _chunk(record, at)
        cuda.append(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def _chunk(record: bytes, at: int) -> tuple[bytes, int]:
    """The length-prefixed bytes at ``at``, and where the next part starts."""
    (size,) = _LEN.unpack_from(record, at)
    at += _LEN.size
    return record[at : at + size], at + size
