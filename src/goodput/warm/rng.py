"""Each rank's RNG states as one compact binary record, captured after every step under warm restarts.

A replacement continues its dead predecessor's random streams from this record (:mod:`goodput.warm.worker`), so
it is written at every ``step_done``: its cost is paid on every step. The earlier form (base64 in JSON) took
~0.3 ms of a step on busy cores, most of a step boundary's cost; this one packs raw bytes, and reads NumPy's
generator in full only when it moved since the previous step:

* Python's ``random``: ``getstate()`` packed as 625 words (~15 µs; comparing it with the previous one costs more).
* NumPy's global (legacy) generator: its ``get_state()`` builds a dict and copies the key (~30 µs). The
  MT19937 state (key and position) is read directly through the bit generator's documented ``ctypes``
  address instead (~1 µs) and compared with the previous step's; only when it moved, or when a cached
  Gaussian was pending (handing it out does not move the state), is ``get_state()`` called. The direct read
  is checked once against ``get_state()`` and not used when they disagree (another layout). The one state
  this cannot tell apart: ``np.random.set_state`` to the very key and position of the previous capture but with
  a different pending Gaussian; :meth:`RngCapture.reset` (called after goodput puts the states back itself)
  forgets the previous capture.
* torch's CPU generator (and CUDA's when initialised): a few KiB copied as they are.

Layout: ``GRNG`` then ``<idiid`` (Python version, gauss_next or NaN, NumPy pos, has_gauss, cached gaussian),
Python's 625 words (``<Q``), NumPy's 624 key words (``<I``), torch's state (``<I`` length first), then the
CUDA states (``<I`` count, each with its ``<I`` length).
"""

from __future__ import annotations

import array
import ctypes
import math
import random
import struct
from typing import Any

__all__ = ["RngCapture", "restore_rng"]

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
        import torch

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
        import numpy as np

        _, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
        self._np_key = np.asarray(key, dtype=np.uint32).tobytes()
        self._np_head = (int(pos), int(has_gauss), float(cached))
        self._np_raw = raw

    def _np_direct(self) -> bytes | None:
        """NumPy's global MT19937 key and position read in place (None: not available or not trusted)."""
        import numpy as np

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


def restore_rng(record: bytes) -> None:
    """Put every RNG back to the state ``record`` (from :meth:`RngCapture.capture`) holds.

    Raises:
        ValueError: when ``record`` is not such a record.
    """
    import numpy as np
    import torch

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
