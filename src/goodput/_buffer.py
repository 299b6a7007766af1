"""A read-only, seekable file over bytes already in memory.

A leaf: ``checkpoint/`` reads a fetched or mapped checkpoint file through it and ``data/`` a mapped tar shard,
so neither imports the other for it.
"""

from __future__ import annotations

import io
import os
from typing import Any

__all__ = ["BufferFile"]


class BufferFile(io.RawIOBase):
    """A seekable read-only file over ``buffer`` (no copy until a read asks for the bytes); closing it releases
    its view of the buffer."""

    def __init__(self, buffer: Any) -> None:
        super().__init__()
        self._view = memoryview(buffer)
        self._pos = 0

    @property
    def view(self) -> memoryview:
        """All the bytes, in place (for readers that copy items straight into their destination)."""
        return self._view

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        data = bytes(self._view[self._pos : end])
        self._pos = max(self._pos, end)
        return data

    def close(self) -> None:
        self._view.release()
        super().close()
