"""Write the demo corpus as a sharded dataset at a URL (a local "remote" folder by default, or s3://...)."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from typing import Any

from goodput.data import write_shards
from goodput.demo.corpus import corpus_bytes, samples

__all__ = ["SAMPLE_BYTES", "write_corpus"]

CONTEXT = 64
SAMPLE_BYTES = CONTEXT + 1  # inputs and the next-byte targets


def _records(limit: int, keep: slice) -> Iterator[bytes]:
    windows = samples(corpus_bytes(limit), SAMPLE_BYTES)
    for index in range(len(windows))[keep]:
        yield struct.pack("<I", index) + windows[index].tobytes()


def write_corpus(
    url: str,
    *,
    limit: int = 2 * 2**20,
    shard_bytes: int = 256 * 2**10,
    storage_options: Mapping[str, Any] | None = None,
    keep: slice = slice(None),
) -> int:
    """Write ``limit`` bytes of the corpus as ``(id, window)`` samples in shards at ``url``; returns the count.

    ``keep`` selects the samples written (``slice(None, -K)``: all but the last K); each keeps the id it has in
    the whole corpus, so two parts written apart never share an id.
    """
    index = write_shards(_records(limit, keep), url, shard_bytes=shard_bytes, storage_options=storage_options)
    return sum(int(s["samples"]) for s in index["shards"])
