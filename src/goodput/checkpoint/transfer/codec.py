"""The one codec of a training state between processes and into RAM: raw tensor bytes behind a typed JSON header.

No pickle anywhere, so decoding never runs code from the bytes. A state's *part* is ``MAGIC | u64 header
length | header JSON | padding | tensor bytes``: the header holds the state's structure (``skeleton``: one typed
node per value) and each tensor's dtype, shape and offset. The nodes are ``{"T": i}`` tensor ``i``; ``{"D":
[[key, node], ...]}`` a dict (keys: str, int, float, bool or None); ``{"L": [...]}`` a list; ``{"U": [...]}`` a
tuple; ``{"V": x}`` None, a bool, int, float or str; ``{"B": base64}`` bytes; ``{"N": [dtype, shape, base64]}`` a
NumPy array (shape None: a NumPy scalar). Those are the only types decoding can build: everything a training
state holds (state dicts, RNG states of torch, NumPy and Python, data positions, small metadata).

A *message* is a part behind an envelope, ``u64 header length | u64 data length | u64 xxh3-64 of the part``,
so a receiver refuses changed bytes before it reads any (:func:`open_message`). The memory tier writes parts
to tmpfs (its marker holds the checksum); :mod:`goodput.checkpoint.transfer.transport` sends messages.

Encoding is split like the durable tier's async strategy: :class:`Staging` copies every tensor into one reused
buffer (the only part that blocks training), and the caller writes or sends header and buffer.
:func:`load_part` copies the tensor bytes into the live tensors in place (DTensor shards included), or into
new CPU tensors where there is no live one.
"""

from __future__ import annotations

import base64
import json
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash

from goodput.errors import CheckpointCorrupt, StateMismatch

__all__ = [
    "CHECKSUM",
    "Message",
    "PartHeader",
    "Staging",
    "checksum",
    "decode",
    "decode_leaf",
    "decode_part",
    "encode",
    "load_part",
    "open_message",
    "parse_part",
]

MAGIC = b"GPMEM001"
_LEN = struct.Struct("<Q")
_ALIGN = 64
_SHIFT = 16  # a big tensor's staged copy sits this far past its address modulo 64 (see _unaliased)
_ENVELOPE = struct.Struct("<QQQ")  # a message's header length, data length, xxh3-64 of header and data
_BIG = 64 << 10  # tensors from this size get a destination that copies fastest (see _unaliased)
CHECKSUM = "xxh3_64"  # the marker's key for a part's hash (older parts' markers hold "crc32" and are refused)


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise CheckpointCorrupt(f"unknown dtype {name!r} in a state part")
    return value


def _local(t: torch.Tensor) -> torch.Tensor:
    """The bytes this rank holds: a DTensor's local shard, else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _encode(value: Any, tensors: list[torch.Tensor]) -> Any:
    """The typed JSON skeleton of a state; tensors are appended to ``tensors`` and referenced by index."""
    if isinstance(value, torch.Tensor):
        tensors.append(_local(value))
        return {"T": len(tensors) - 1}
    if isinstance(value, Mapping):
        return {"D": [[_key(k), _encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"U": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return {"L": [_encode(v, tensors) for v in value]}
    if isinstance(value, np.ndarray | np.generic):  # before float: np.float64 is a float
        array = np.ascontiguousarray(value)
        if array.dtype.hasobject:
            raise TypeError("a state cannot hold a NumPy array of Python objects")
        shape = None if isinstance(value, np.generic) else list(array.shape)
        return {"N": [array.dtype.str, shape, base64.b64encode(array.tobytes()).decode("ascii")]}
    if isinstance(value, bytes | bytearray):
        return {"B": base64.b64encode(value).decode("ascii")}
    if value is None or isinstance(value, bool | int | float | str):
        return {"V": value}
    raise TypeError(
        f"a training state cannot hold a {type(value).__name__} (not a tensor, container or scalar)"
    )


def _key(key: Any) -> Any:
    if key is None or isinstance(key, bool | int | float | str):
        return key
    raise TypeError(f"a state dict key must be a str, int, float, bool or None, not a {type(key).__name__}")


def decode_leaf(kind: str, value: Any) -> Any:
    """The value of a skeleton node that holds no tensor (``V``, ``B``, ``N``); anything else is refused.

    Raises:
        CheckpointCorrupt: an unknown node, or a NumPy dtype that would hold Python objects.
    """
    if kind == "V":
        return value
    if kind == "B":
        return base64.b64decode(value, validate=True)
    if kind == "N":
        dtype_text, shape, data = value
        dtype = np.dtype(str(dtype_text))
        if dtype.hasobject:
            raise CheckpointCorrupt(f"a NumPy array of Python objects ({dtype_text}) in a state")
        array = np.frombuffer(base64.b64decode(data, validate=True), dtype=dtype).copy()
        return array[0] if shape is None else array.reshape(shape)
    raise CheckpointCorrupt(f"unknown node {kind!r} in a state's header")


@dataclass(frozen=True)
class PartHeader:
    """What a part holds: identity, structure, and where each tensor's bytes are."""

    run: str
    step: int
    rank: int
    world_size: int
    skeleton: Any
    tensors: list[tuple[str, list[int], int, int]]  # dtype, shape, offset, nbytes
    data_bytes: int

    def to_bytes(self) -> bytes:
        text = json.dumps(self.__dict__, separators=(",", ":")).encode()
        # The tensor bytes start _SHIFT bytes before a multiple of 64, so that a big tensor, staged _SHIFT bytes
        # past its own address modulo 64 (see _unaliased), lies in the file at its own address modulo 64: the
        # kernel's copy into the live tensor at restore (preadv) is ~10% faster between addresses that agree
        # modulo 64 than 16 bytes apart (the opposite of torch's copy when staging).
        pad = (-(len(MAGIC) + _LEN.size + len(text)) - _SHIFT) % _ALIGN
        return MAGIC + _LEN.pack(len(text) + pad) + text + b" " * pad


class Staging:
    """One reused host buffer that holds a copy of every tensor of a state dict (the blocking part of a save).

    The buffer grows to the largest state seen and is reused by every later save; it is pinned when CUDA is
    available so device-to-host copies run at full speed.
    """

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)
        # the layout of the last save and its destinations (views of the buffer shaped like the tensors):
        # reused while the state keeps its layout, so a save is one batched copy, not ~5 ops per tensor
        self._layout: tuple[int, list[tuple[str, list[int], int, int]]] | None = None
        self._targets: list[torch.Tensor] = []
        self._skeleton: Any = None
        self._plain = False  # the last staged state held no sharded tensor

    def stage(
        self, state_dict: Mapping[str, Any], *, run: str, step: int, rank: int, world: int
    ) -> PartHeader:
        """Copy every tensor of ``state_dict`` into the buffer; returns the header describing the copy."""
        tensors: list[torch.Tensor] = []
        skeleton = _encode(state_dict, tensors)
        self._skeleton, self._plain = skeleton, _plain(state_dict)
        sizes = [t.numel() * t.element_size() for t in tensors]
        bound = sum(n + 2 * _ALIGN for n in sizes)
        if self.buffer.numel() < bound:
            self.buffer = torch.empty(bound, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        entries: list[tuple[str, list[int], int, int]] = []
        offset, base = 0, self.buffer.data_ptr()
        for t, nbytes in zip(tensors, sizes, strict=True):
            offset += -offset % _ALIGN
            if nbytes >= _BIG and t.device.type == "cpu":
                offset += _unaliased(base + offset, t.data_ptr())
            entries.append((str(t.dtype), list(t.shape), offset, nbytes))
            offset += nbytes
        offset += -offset % _ALIGN
        self._copy(tensors, entries)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return PartHeader(run, step, rank, world, skeleton, entries, offset)

    def staged_dict(self) -> dict[str, Any] | None:
        """The last staged state dict, its tensors viewing the buffer (valid until the next ``stage``).

        None when the state held sharded tensors (the buffer has only the local shards) or was not staged as
        whole host tensors: then only the part format can be built from the buffer.
        """
        if not self._plain or self._layout is None or self._layout[0] != self.buffer.data_ptr():
            return None
        out = _rebuild(self._skeleton, self._targets)
        return out if isinstance(out, dict) else None

    def _copy(self, tensors: list[torch.Tensor], entries: list[tuple[str, list[int], int, int]]) -> None:
        """Copy each tensor to its entry's place in the buffer: one batched copy when all are on the host."""
        with torch.no_grad():
            if not tensors or not all(t.device.type == "cpu" and t.numel() for t in tensors):
                self._layout = None
                for t, (_, _, start, nbytes) in zip(tensors, entries, strict=True):
                    if nbytes:
                        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
                        self.buffer[start : start + nbytes].copy_(flat)
                return
            layout = (self.buffer.data_ptr(), entries)
            if self._layout != layout:
                self._targets = [
                    self.buffer[start : start + nbytes].view(t.dtype).view(t.shape)
                    for t, (_, _, start, nbytes) in zip(tensors, entries, strict=True)
                ]
                self._layout = layout
            torch._foreach_copy_(self._targets, tensors)


def _plain(value: Any) -> bool:
    """Whether no tensor in ``value`` is sharded (a DTensor: its ``to_local`` is what gets staged)."""
    if isinstance(value, torch.Tensor):
        return not callable(getattr(value, "to_local", None))
    if isinstance(value, Mapping):
        return all(_plain(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    return True


def _rebuild(node: Any, tensors: list[torch.Tensor]) -> Any:
    """The value a skeleton describes, with ``tensors[i]`` for its tensor ``i``."""
    kind, value = next(iter(node.items()))
    if kind == "T":
        return tensors[value]
    if kind == "D":
        return {k: _rebuild(v, tensors) for k, v in value}
    if kind == "L":
        return [_rebuild(v, tensors) for v in value]
    if kind == "U":
        return tuple(_rebuild(v, tensors) for v in value)
    return value


def _unaliased(dst: int, src: int) -> int:
    """Bytes (0-63) to move ``dst`` so that it sits 16 bytes past ``src`` modulo 64.

    Why: the CPU copy is slower between addresses that agree modulo 32 than between addresses 16 bytes apart;
    16 keeps every dtype's alignment.
    """
    return (src + _SHIFT - dst) % _ALIGN


def checksum(blob: memoryview | bytes) -> str:
    """The xxh3-64 hex digest of a whole part (what its marker records)."""
    return str(xxhash.xxh3_64_hexdigest(blob))


def decode_part(blob: memoryview, *, size: int, digest: str) -> tuple[PartHeader, memoryview]:
    """Check a part's size and xxh3-64 digest and parse its header; returns the header and the tensor bytes.

    Raises:
        CheckpointCorrupt: wrong size (truncated), wrong checksum (a changed byte) or an unreadable header.
    """
    if len(blob) != size:
        raise CheckpointCorrupt(f"holds {len(blob)} bytes, its marker says {size} (truncated?)")
    if checksum(blob) != digest:
        raise CheckpointCorrupt("checksum mismatch (a byte changed after it was written)")
    return parse_part(blob)


def parse_part(blob: memoryview) -> tuple[PartHeader, memoryview]:
    """The header of a part (or of its first bytes) and the bytes after it; checks nothing but the header.

    Raises:
        CheckpointCorrupt: not a part, or an unreadable header.
    """
    if bytes(blob[: len(MAGIC)]) != MAGIC or len(blob) < len(MAGIC) + _LEN.size:
        raise CheckpointCorrupt("not a goodput state part")
    (length,) = _LEN.unpack_from(blob, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    try:
        fields = json.loads(bytes(blob[start : start + length]))
        header = PartHeader(**fields)
    except (ValueError, TypeError) as err:
        raise CheckpointCorrupt(f"unreadable header: {err}") from None
    return header, blob[start + length :]


def _view(data: memoryview, offset: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over ``nbytes`` of ``data`` (no copy; only ever read, so a read-only mapping is fine)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(data, dtype=torch.uint8, count=nbytes, offset=offset)


def _decode(node: Any, current: Any, data: memoryview, header: PartHeader, path: str) -> Any:
    kind, value = next(iter(node.items()))
    if kind == "L" or kind == "U":
        cur = (
            current
            if isinstance(current, list | tuple) and len(current) == len(value)
            else [None] * len(value)
        )
        items = [
            _decode(v, c, data, header, f"{path}[{i}]")
            for i, (v, c) in enumerate(zip(value, cur, strict=True))
        ]
        return items if kind == "L" else tuple(items)
    if kind == "D":
        cur_map = current if isinstance(current, Mapping) else {}
        return {
            k: _decode(v, cur_map.get(k), data, header, f"{path}.{k}" if path else str(k)) for k, v in value
        }
    if kind == "T":
        dtype_name, shape, offset, nbytes = header.tensors[value]
        saved = _view(data, offset, nbytes) if nbytes else None
        if isinstance(current, torch.Tensor):
            target = _local(current)
            if list(target.shape) != list(shape) or str(target.dtype) != dtype_name:
                raise StateMismatch(
                    f"{path}: the memory checkpoint has {dtype_name} {shape}, this run has"
                    f" {target.dtype} {list(target.shape)}"
                )
            if saved is not None:
                with torch.no_grad():
                    if target.is_contiguous():
                        target.reshape(-1).view(torch.uint8).copy_(saved)
                    else:
                        target.copy_(saved.view(_dtype(dtype_name)).reshape(shape))
            return current
        out = torch.empty(shape, dtype=_dtype(dtype_name))
        if saved is not None:
            out.reshape(-1).view(torch.uint8).copy_(saved)
        return out
    return decode_leaf(kind, value)


def load_part(header: PartHeader, data: memoryview, current: Mapping[str, Any]) -> dict[str, Any]:
    """The saved state dict, with every tensor copied into the matching tensor of ``current`` in place.

    Raises:
        StateMismatch: a tensor's shape or dtype differs from this run's.
    """
    out = _decode(header.skeleton, current, data, header, "")
    assert isinstance(out, dict)
    return out


@dataclass(frozen=True)
class Message:
    """An encoded state ready to send: the part's header bytes, its tensor bytes and the xxh3-64 of both."""

    head: bytes | memoryview
    data: torch.Tensor  # uint8, on the host
    digest: int

    @classmethod
    def seal(cls, head: bytes | memoryview, data: torch.Tensor, digest: str | None = None) -> Message:
        """The message of a part whose bytes are ``head`` then ``data``; ``digest``: their known hex checksum
        (a written part's), else computed here."""
        if digest is None:
            hasher = xxhash.xxh3_64(head)
            if data.numel():
                hasher.update(data.numpy().data)
            return cls(head, data, hasher.intdigest())
        return cls(head, data, int(digest, 16))

    @property
    def envelope(self) -> bytes:
        return _ENVELOPE.pack(len(self.head), self.data.numel(), self.digest)

    def to_bytes(self) -> bytes:
        """The message as one byte string (envelope, header, tensor bytes): what :func:`decode` reads."""
        return self.envelope + bytes(self.head) + self.data.numpy().tobytes()


def encode(state: Mapping[str, Any], *, staging: Staging | None = None) -> Message:
    """``state`` as a message, its tensors copied into ``staging``'s buffer (a new one when None).

    Raises:
        TypeError: the state holds a value the codec cannot express (see the module's docstring).
    """
    staging = staging or Staging()
    header = staging.stage(state, run="", step=0, rank=0, world=1)
    return Message.seal(header.to_bytes(), staging.buffer[: header.data_bytes])


def open_message(blob: bytes | bytearray | memoryview) -> tuple[memoryview, str]:
    """The part inside a message and its hex checksum, once both lengths and the checksum are right.

    Raises:
        CheckpointCorrupt: a short, long or changed message.
    """
    view = memoryview(blob).cast("B")
    if len(view) < _ENVELOPE.size:
        raise CheckpointCorrupt(f"a state message of {len(view)} bytes is shorter than its envelope")
    head_len, data_len, digest = _ENVELOPE.unpack_from(view)
    part = view[_ENVELOPE.size :]
    if len(part) != head_len + data_len:
        raise CheckpointCorrupt(
            f"a state message holds {len(part)} bytes, its envelope says {head_len + data_len}"
        )
    if xxhash.xxh3_64_intdigest(part) != digest:
        raise CheckpointCorrupt("a state message's checksum does not match (a byte changed on the way)")
    return part, f"{digest:016x}"


def decode(message: bytes | bytearray | memoryview | Message) -> dict[str, Any]:
    """The state a message holds, its tensors new CPU tensors (a :class:`Message` of this process: unchecked).

    Raises:
        CheckpointCorrupt: changed or unreadable bytes; nothing is built from them.
    """
    if isinstance(message, Message):
        header, _ = parse_part(memoryview(message.head))
        data = message.data.numpy().data
    else:
        header, data = parse_part(open_message(message)[0])
    if len(data) != header.data_bytes:
        raise CheckpointCorrupt(
            f"a state part holds {len(data)} tensor bytes, its header says {header.data_bytes}"
        )
    try:
        out = _decode(header.skeleton, None, data, header, "")
    except (IndexError, KeyError, ValueError, TypeError, AttributeError, RuntimeError, StopIteration) as err:
        raise CheckpointCorrupt(f"unreadable header: {type(err).__name__}: {err}") from None
    if not isinstance(out, dict):
        raise CheckpointCorrupt(f"a state message holds a {type(out).__name__}, not a state dict")
    return out
