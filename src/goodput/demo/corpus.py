"""The demo's text: the source of Python's own standard library, which every Python installation ships.

Deterministic on one installation (sorted file list, fixed byte budget); no download.
"""

from __future__ import annotations

import os
import sysconfig

import numpy as np

__all__ = ["corpus_bytes", "samples"]


def corpus_bytes(limit: int = 4 * 2**20) -> bytes:
    """Up to ``limit`` bytes of standard-library Python source, files in sorted order."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, total = [], 0
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not name.endswith(".py") or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        chunks.append(data)
        total += len(data)
        if total >= limit:
            break
    return b"".join(chunks)[:limit]


def samples(data: bytes, length: int) -> np.ndarray:
    """Non-overlapping windows of ``length`` bytes, as a (n, length) uint8 array."""
    n = len(data) // length
    return np.frombuffer(data[: n * length], dtype=np.uint8).reshape(n, length)
