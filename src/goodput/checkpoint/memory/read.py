"""Restoring a memory-tier part in one pass: file bytes straight into the live tensors, hashed on the way.

Mapping the whole part, hashing it, then copying it into the live state would take two passes over the bytes
plus the page-table work of mapping (and unmapping) every page. :func:`read_part_into` instead reads the part with ``preadv`` in 1 MiB pieces directly into the memory of the
tensors that will hold it (the kernel's copy out of the tmpfs page cache is the only copy) and hashes each piece
while it is still in the CPU cache, so the check costs almost nothing more. The kernel's copy is cheapest
from a part held in 2 MiB pages (``huge_pages``) and between addresses that agree modulo 64 (the part's layout
puts each big tensor at its own address modulo 64).

Everything that can be checked before a byte lands is checked first: the header (read and hashed first), the
part's identity (run, step, rank), its size, and every tensor's dtype and shape against this run's state, so a
part of another run or of another model never touches the live state. Only a byte changed inside the tensor
data is found after the tensors were written: the caller then treats the part as damaged and loads another
checkpoint over it (see ``MemoryCheckpointer.restore``), or, when there is none to fall back to, uses
:func:`goodput.checkpoint.transfer.codec.decode_part` (check first, then copy) instead of this function.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch
import xxhash

from goodput.checkpoint.transfer.codec import _LEN, MAGIC, PartHeader, _dtype, _local, decode_leaf
from goodput.errors import CheckpointCorrupt, StateMismatch

__all__ = ["read_part_into"]

_PIECE = 1 << 20  # read and hash 1 MiB at a time: the piece is still in cache when the hash reads it


class _Reader:
    """Sequential reads of one file through ``preadv``, every byte hashed in order."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size, self.pos = fd, size, 0
        self.hasher = xxhash.xxh3_64()
        self._scratch = bytearray(_PIECE)

    def into(self, view: memoryview) -> None:
        """Fill ``view`` (a writable byte view) with the next ``len(view)`` bytes of the file."""
        done, total = 0, len(view)
        while done < total:
            piece = view[done : min(total, done + _PIECE)]
            got = os.preadv(self.fd, [piece], self.pos)
            if got <= 0:
                raise CheckpointCorrupt(f"ends at byte {self.pos} of {self.size} (truncated?)")
            self.hasher.update(piece[:got])
            done += got
            self.pos += got

    def skip_to(self, end: int) -> None:
        """Hash the bytes up to ``end`` (alignment padding) without keeping them."""
        while self.pos < end:
            self.into(memoryview(self._scratch)[: min(_PIECE, end - self.pos)])

    def bytes(self, n: int) -> bytes:
        out = bytearray(n)
        self.into(memoryview(out))
        return bytes(out)


def _header(reader: _Reader) -> PartHeader:
    prefix = reader.bytes(len(MAGIC) + _LEN.size)
    if prefix[: len(MAGIC)] != MAGIC:
        raise CheckpointCorrupt("not a goodput memory-tier part")
    (length,) = _LEN.unpack_from(prefix, len(MAGIC))
    if length > reader.size - reader.pos:
        raise CheckpointCorrupt(f"its header claims {length} bytes, the part has {reader.size} (damaged?)")
    try:
        header = PartHeader(**json.loads(reader.bytes(length)))
    except (ValueError, TypeError) as err:
        raise CheckpointCorrupt(f"unreadable header: {err}") from None
    if reader.pos + int(header.data_bytes) != reader.size:
        raise CheckpointCorrupt(
            f"holds {reader.size} bytes, its header says {reader.pos + header.data_bytes}"
        )
    return header


class _Plan:
    """Where each saved tensor's bytes go: (offset, nbytes, byte view to fill, live tensor to copy into or None)."""

    def __init__(self, header: PartHeader) -> None:
        self.header = header
        self.pieces: list[tuple[int, int, torch.Tensor, torch.Tensor | None]] = []

    def build(self, node: Any, current: Any, path: str) -> Any:
        """The loaded state dict's structure (live tensors where this run has them); fills ``pieces``."""
        kind, value = next(iter(node.items()))
        if kind in ("L", "U"):
            same = isinstance(current, list | tuple) and len(current) == len(value)
            cur = current if same else [None] * len(value)
            items = [
                self.build(v, c, f"{path}[{i}]") for i, (v, c) in enumerate(zip(value, cur, strict=True))
            ]
            return items if kind == "L" else tuple(items)
        if kind == "D":
            cur_map = current if isinstance(current, Mapping) else {}
            return {k: self.build(v, cur_map.get(k), f"{path}.{k}" if path else str(k)) for k, v in value}
        if kind == "T":
            return self._tensor(int(value), current, path)
        return decode_leaf(kind, value)

    def _tensor(self, index: int, current: Any, path: str) -> torch.Tensor:
        dtype_name, shape, offset, nbytes = self.header.tensors[index]
        dtype = _dtype(dtype_name)
        numel = 1
        for dim in shape:
            numel *= int(dim)
        if nbytes != numel * dtype.itemsize or offset < 0 or offset + nbytes > self.header.data_bytes:
            raise CheckpointCorrupt(f"{path}: {nbytes} bytes at {offset} do not fit {dtype_name} {shape}")
        if not isinstance(current, torch.Tensor):
            out = torch.empty(shape, dtype=dtype)
            self.pieces.append((offset, nbytes, out.reshape(-1).view(torch.uint8), None))
            return out
        target = _local(current)
        if list(target.shape) != list(shape) or target.dtype != dtype:
            raise StateMismatch(
                f"{path}: the memory checkpoint has {dtype_name} {shape}, this run has"
                f" {target.dtype} {list(target.shape)}"
            )
        if target.device.type == "cpu" and target.is_contiguous():
            self.pieces.append((offset, nbytes, target.reshape(-1).view(torch.uint8), None))
        else:  # read on the host, then one copy into a device tensor or a strided one
            host = torch.empty(shape, dtype=dtype)
            self.pieces.append((offset, nbytes, host.reshape(-1).view(torch.uint8), target))
        return current


def read_part_into(
    path: str, *, size: int, digest: str, current: Mapping[str, Any], expect: tuple[str, int, int]
) -> dict[str, Any]:
    """Read the part at ``path`` into the tensors of ``current`` in place; returns the saved state dict.

    ``expect`` is the (run, step, rank) the part must belong to; ``size`` and ``digest`` come from its marker.

    Raises:
        CheckpointCorrupt: wrong size, header, identity or checksum. Found before any tensor is written,
            except a checksum mismatch: then the live tensors hold the damaged bytes and must be loaded again.
        StateMismatch: a tensor's dtype or shape differs from this run's (found before any byte is written).
        OSError: the part cannot be read.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        actual = os.fstat(fd).st_size
        if actual != size:
            raise CheckpointCorrupt(f"holds {actual} bytes, its marker says {size} (truncated?)")
        reader = _Reader(fd, size)
        header = _header(reader)
        if (header.run, header.step, header.rank) != expect:
            raise CheckpointCorrupt(f"holds step {header.step} of rank {header.rank} of run {header.run}")
        plan = _Plan(header)
        try:
            out = plan.build(header.skeleton, current, "")
        except StateMismatch:  # nothing written yet: a damaged header must not pass for another model
            reader.skip_to(size)
            if reader.hasher.hexdigest() != digest:
                raise CheckpointCorrupt("checksum mismatch (a byte changed after it was written)") from None
            raise
        except (IndexError, KeyError, ValueError, TypeError, AttributeError, StopIteration) as err:
            raise CheckpointCorrupt(f"unreadable header: {type(err).__name__}: {err}") from None
        if not isinstance(out, dict):
            raise CheckpointCorrupt("its state is not a dict")
        base = reader.pos
        end = base
        with torch.no_grad():
            for offset, nbytes, view, target in sorted(plan.pieces, key=lambda p: p[0]):
                if base + offset < end:
                    raise CheckpointCorrupt("two tensors overlap in its header")
                reader.skip_to(base + offset)
                if nbytes:
                    reader.into(memoryview(view.numpy().data).cast("B"))
                if target is not None:
                    target.copy_(view.view(target.dtype).reshape(target.shape))
                end = base + offset + nbytes
        reader.skip_to(size)
    finally:
        os.close(fd)
    if reader.hasher.hexdigest() != digest:
        raise CheckpointCorrupt("checksum mismatch (a byte changed after it was written)")
    return out
