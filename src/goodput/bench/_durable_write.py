"""Ways to put a rank's tensors durably into new files on a local disk: the candidates for a save's floor.

``goodput bench checkpoint`` times each once and takes the fastest as its durable-write floor, so the floor is
the best this disk does for those bytes, not one thread's ``f.write``:

- ``one_file``: one file, written in order by one thread, then ``fsync``;
- ``files_threads``: the tensors spread over ``THREADS`` files, each written and fsync'ed by its own thread
  (the kernel copies and the device queue are kept busy in parallel; the GIL is released in ``write``);
- ``direct``: one file opened with ``O_DIRECT`` (no page cache), written from an aligned buffer in
  ``CHUNK``-byte blocks, then ``fsync`` for the metadata.
"""

from __future__ import annotations

import glob
import mmap
import os
import threading
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["CHUNK", "METHODS", "THREADS", "remove"]

THREADS = 4
CHUNK = 16 << 20
_ALIGN = 4096


def _one_file(arrays: Sequence[np.ndarray], path: str) -> None:
    with open(path + ".0", "wb") as f:
        for a in arrays:
            f.write(a.data)
        f.flush()
        os.fsync(f.fileno())


def _spread(arrays: Sequence[np.ndarray], parts: int) -> list[list[np.ndarray]]:
    """The arrays dealt into ``parts`` groups of about equal bytes (largest first)."""
    groups: list[list[np.ndarray]] = [[] for _ in range(parts)]
    sizes = [0] * parts
    for a in sorted(arrays, key=lambda x: x.nbytes, reverse=True):
        i = sizes.index(min(sizes))
        groups[i].append(a)
        sizes[i] += a.nbytes
    return groups


def _files_threads(arrays: Sequence[np.ndarray], path: str) -> None:
    errors: list[BaseException] = []

    def write(i: int, group: list[np.ndarray]) -> None:
        try:
            _one_file(group, f"{path}.t{i}")
        except BaseException as err:  # re-raised in the caller's thread
            errors.append(err)

    threads = [threading.Thread(target=write, args=(i, g)) for i, g in enumerate(_spread(arrays, THREADS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _direct(arrays: Sequence[np.ndarray], path: str) -> None:
    buffer = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT requires
    view = memoryview(buffer)
    fd = os.open(path + ".0", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o644)
    try:
        filled = offset = 0
        for a in arrays:
            source = memoryview(a.reshape(-1).view(np.uint8).data)
            i = 0
            while i < len(source):
                n = min(CHUNK - filled, len(source) - i)
                view[filled : filled + n] = source[i : i + n]
                filled, i = filled + n, i + n
                if filled == CHUNK:
                    os.pwrite(fd, view, offset)
                    offset, filled = offset + CHUNK, 0
        if filled:
            os.pwrite(fd, view[: -(-filled // _ALIGN) * _ALIGN], offset)
            os.ftruncate(fd, offset + filled)
        os.fsync(fd)
    finally:
        os.close(fd)
        view.release()
        buffer.close()


METHODS: dict[str, Callable[[Sequence[np.ndarray], str], None]] = {
    "one_file": _one_file,
    "files_threads": _files_threads,
    "direct": _direct,
}


def remove(path: str) -> None:
    """Remove every file a method wrote under ``path``."""
    for name in glob.glob(glob.escape(path) + ".*"):
        os.remove(name)
