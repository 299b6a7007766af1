"""The numeric guard's agreement riding DDP's gradient all-reduce: no collective of its own.

Each rank's word for step N (four int64, :func:`~goodput.run.numeric.rules.encode_row`) travels with the first
gradient bucket of step N+1's backward (:func:`~goodput.run._comm_hook.set_rider`), read at step N+1's
``step_done``: the same step the all-gather on the guard's own group was read, without a collective of its
own on the step's path. Every rank owns a band of elements of
the payload: it writes its word there, cut into integers small enough for the bucket's float type to hold
exactly, and zeros everywhere else. The all-reduce sums one integer and zeros per element, which is exact, so
every rank reads every rank's word bit for bit and draws the same verdict.
A backward with no word to send sends zeros of the same length, so the bucket's collective, and with it the
order the gradients are summed in, is the same at every step of every attempt.

When no backward ran between two ``step_done`` calls (the loop's last step, a step whose backward ran under
``no_sync``), the word never left: every rank finds that alike (DDP reduces the same buckets on every rank) and
the word is all-gathered on the guard's own group instead, as it is for a model that is not DDP.
"""

from __future__ import annotations

import struct
import sys
from array import array
from typing import Any

from goodput.run.numeric.exchange import start_gather
from goodput.run.numeric.rules import ROW_WORDS

__all__ = ["Carried", "Carrier"]

# A piece's unsigned type by its width: as wide as the bucket's float type holds integers exactly, rounded down
# to 8, 16 or 32 bits, so that cutting a word into pieces and joining them again is one struct call, not a loop.
_PIECE_TYPES = {8: "B", 16: "H", 32: "I"}
_BITS: dict[Any, int] = {}  # a float type's piece width, filled on first use (torch is imported late)


def _piece_bits(dtype: Any) -> int | None:
    """The piece width for ``dtype``'s elements (None: not a float type we use): float32 holds 24-bit integers
    exactly, float64 53, bfloat16 8 and float16 11."""
    if not _BITS:
        import torch

        _BITS.update({torch.float32: 16, torch.float64: 32, torch.bfloat16: 8, torch.float16: 8})
    return _BITS.get(dtype)


def pieces_of(row: list[int], bits: int) -> array:
    """``row`` (int64s) as unsigned ``bits``-bit pieces, lowest first: one rank's band of a payload."""
    pieces = array(_PIECE_TYPES[bits], struct.pack(f"<{len(row)}q", *row))
    if sys.byteorder == "big":
        pieces.byteswap()
    return pieces


def encode(row: list[int], rank: int, world: int, bits: int) -> list[int]:
    """``row`` (int64s) as unsigned ``bits``-bit pieces, placed in ``rank``'s band of a ``world``-wide payload."""
    band = pieces_of(row, bits).tolist()
    return [0] * (rank * len(band)) + band + [0] * ((world - rank - 1) * len(band))


def decode(summed: list[float], world: int, bits: int) -> list[list[int]]:
    """Every rank's row from the summed payload (each element one rank's piece plus zeros: exact)."""
    pieces = array(_PIECE_TYPES[bits], map(int, summed))
    if sys.byteorder == "big":
        pieces.byteswap()
    words = struct.unpack(f"<{len(pieces) * bits // 64}q", pieces.tobytes())
    width = len(words) // world
    return [list(words[r * width : (r + 1) * width]) for r in range(world)]


class Carried:
    """One step's word waiting for the next backward's first bucket (:class:`Carrier`), or on its way."""

    def __init__(self, step: int, row: list[int], carrier: Carrier) -> None:
        self.step, self.row, self._carrier = step, row, carrier
        self.trip: tuple[Any, Any] | None = None  # (future, summed payload) once departed
        self._rows: list[list[int]] | None = None

    def rows(self) -> list[list[int]]:
        """Every rank's row, by rank: from the bucket it rode, else (it never left) from an all-gather."""
        if self._rows is None:
            if self.trip is None:
                self._carrier.cancel(self)
                self._rows = start_gather(self.step, self.row, self._carrier.group).rows()
            else:
                future, summed = self.trip
                future.wait()
                bits = _piece_bits(summed.dtype)
                assert bits is not None, "a payload went in a dtype Carrier.payload refuses"
                self._rows = decode(summed.tolist(), self._carrier.world, bits)
        return self._rows


class _Staged:
    """A payload for one bucket type: the values (zeros outside this rank's band, kept from call to call) and a
    tensor over the same memory, so that a payload costs a few stores, not a tensor made from a list. Every piece
    fits a float32 exactly but float64's 32-bit ones."""

    def __init__(self, dtype: Any, bits: int, rank: int, world: int) -> None:
        import torch

        double = bits > 16
        size = world * ROW_WORDS * 64 // bits
        self.values = array("d" if double else "f", bytes((8 if double else 4) * size))
        self.view = torch.frombuffer(self.values, dtype=torch.float64 if double else torch.float32)
        self.bits, self.rank = bits, rank
        self.payload = self.view if self.view.dtype == dtype else self.view.to(dtype)
        self.holding: Carried | None = None  # the word the values hold (None: zeros)

    def hold(self, word: Carried | None) -> None:
        band = pieces_of(word.row if word is not None else [0] * ROW_WORDS, self.bits)
        self.values[self.rank * len(band) : (self.rank + 1) * len(band)] = array(self.values.typecode, band)
        if self.payload is not self.view:
            self.payload.copy_(self.view)
        self.holding = word


class Carrier:
    """The rider of one DDP model's hook: sends the newest word that has not left yet.

    Args:
        rank: this rank in the model's process group (the whole job's: see ``BucketCheck.install``).
        world: the group's size.
        group: the guard's own gloo group, for a word that never left.
    """

    def __init__(self, rank: int, world: int, group: Any) -> None:
        self.rank, self.world, self.group = rank, world, group
        self._boarding: Carried | None = None
        self._riding: Carried | None = None
        self._padding = False  # the last payload was zeros: no word boarded
        self._staged: dict[Any, _Staged] = {}  # by the bucket's float type

    def board(self, step: int, row: list[int]) -> Carried:
        """``row`` goes with the next backward's first bucket; the exchange to read it from.

        The word is written into each payload here, between steps: the same few dozen Python operations take
        several times longer inside a backward, where :meth:`payload` is called."""
        self._boarding = word = Carried(step, row, self)
        for staged in self._staged.values():
            staged.hold(word)
        return word

    def cancel(self, word: Carried) -> None:
        """``word`` will not ride: it is read from an all-gather instead (a no-op once it departed)."""
        if self._boarding is word:
            self._boarding = None

    def clear(self) -> None:
        """Forget every word (a restore or a rollback: the steps they judge are gone)."""
        self._boarding = self._riding = None

    def payload(self, dtype: Any) -> Any:
        """The hook's first bucket: the boarding word's payload, zeros of its length when no word boards (None: a
        dtype it cannot carry).

        The bucket's collective is as long at every backward, word or not: its length decides where the
        all-reduce cuts it into chunks, and with three ranks or more an element's chunk decides the order its
        sum is taken in. The first backward after a restore finds no word (the step before was judged in the
        attempt that ended), and it must sum the gradients as the uninterrupted run did at that step.
        """
        word, bits = self._boarding, _piece_bits(dtype)
        if bits is None:
            return None
        self._padding = word is None
        if word is not None:
            if self._riding is not None:
                self._riding.rows()  # read before the reused buffer carries this word (judged already, normally)
            self._boarding, self._riding = None, word
        staged = self._staged.get(dtype)
        if staged is None:
            staged = self._staged[dtype] = _Staged(dtype, bits, self.rank, self.world)
        if staged.holding is not word:  # boarded before this dtype's first bucket, or zeros where none boards
            staged.hold(word)
        return staged.payload  # valid until the next board or call

    def departed(self, future: Any, summed: Any) -> None:
        """The riding word's all-reduce started: ``summed`` holds every rank's word once ``future`` is done."""
        if self._padding:
            return  # zeros went: no word rode
        word = self._riding
        assert word is not None, "Carrier.departed without a payload"
        word.trip = (future, summed)
