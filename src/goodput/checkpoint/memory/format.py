"""The memory tier's part file: the transfer codec's part (:mod:`goodput.checkpoint.transfer.codec`) on tmpfs.

:func:`write_part` writes a staged part in the background, hashing the bytes on the way (xxh3-64, fast enough
to ride along the write); the part's marker keeps the checksum. Reading checks it first
(:func:`~goodput.checkpoint.transfer.codec.decode_part`) or on the way (:mod:`goodput.checkpoint.memory.read`).
"""

from __future__ import annotations

import os

import torch
import xxhash

from goodput.checkpoint.memory.huge_pages import prefer_huge_pages
from goodput.checkpoint.transfer.codec import CHECKSUM, PartHeader, Staging, checksum, decode_part, load_part

__all__ = ["CHECKSUM", "PartHeader", "Staging", "checksum", "decode_part", "load_part", "write_part"]

_CHUNK = 1 << 20  # written then hashed while still in the CPU cache


def write_part(path: str, header: PartHeader, buffer: torch.Tensor) -> tuple[int, str]:
    """Write a staged part to ``path``; returns (file size, xxh3-64 hex digest of the file).

    Raises:
        OSError: the write failed (a full tmpfs raises ``ENOSPC``); a partial file may remain.
    """
    head = header.to_bytes()
    data = buffer[: header.data_bytes].numpy()
    hasher = xxhash.xxh3_64(head)
    # An existing file (a recycled part, see MemoryStore.recycle) is overwritten in place: its RAM pages are
    # already allocated, while a fresh tmpfs file costs a page fault per page (~2x the write on a busy box).
    # Its pages are made huge pages first (once per file): the restore reads it back ~1.5x faster.
    with open(path, "r+b" if os.path.exists(path) else "w+b") as f:  # readable: mapped to collapse its pages
        prefer_huge_pages(f.fileno(), len(head) + header.data_bytes)
        f.write(head)
        for start in range(0, header.data_bytes, _CHUNK):
            chunk = data[start : start + _CHUNK].data
            f.write(chunk)
            hasher.update(chunk)
        f.truncate()
    return len(head) + header.data_bytes, hasher.hexdigest()
