"""A sharded dataset format: many samples per shard file plus one JSON index, at any fsspec URL.

A shard is ``b"GPSHARD1"``, the sample count ``n`` (uint64, little-endian), ``n + 1`` sample offsets (uint64,
relative to the end of the header) and then the samples' bytes back to back. ``index.json`` lists the shards in
order with their sample counts, sizes and MD5s, and the samples' keys when they were written with one (``goodput
data write`` keeps each file's path relative to the source folder, so labels taken from file names survive); it is
written last, so a dataset is readable only once complete. Samples are bytes; the reader applies the user's
``decode`` function, and :meth:`ShardedDataset.key` gives a sample's key.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from goodput._client_random import isolate_store_clients
from goodput._storage_errors import secret_values
from goodput.data._files import Handles, Pieces
from goodput.data._remote import RemoteInfo, RetryPolicy, call_with_retries
from goodput.data._source import Buffer, Source, join_url
from goodput.data.cache import CacheConfig
from goodput.errors import ConfigError, DataError

__all__ = ["ShardWriter", "ShardedDataset", "write_folder_shards", "write_shards"]

MAGIC = b"GPSHARD1"
INDEX_NAME = "index.json"
FORMAT = "goodput-shards"
T = TypeVar("T")
_U64 = struct.Struct("<Q")


def _identity(data: bytes) -> Any:
    return data


class ShardWriter:
    """Writes samples into shards of about ``shard_bytes`` each under ``url``; ``close()`` writes the index.

    Args:
        url: fsspec URL of the dataset folder (created).
        shard_bytes: target size of one shard; a shard closes once it reaches this size.
        storage_options: passed to fsspec (credentials stay out of every message).
    """

    def __init__(
        self, url: str, *, shard_bytes: int = 64 << 20, storage_options: Mapping[str, Any] | None = None
    ) -> None:
        if shard_bytes < 1:
            raise ConfigError(f"shard_bytes must be at least 1, got {shard_bytes}")
        import fsspec
        from fsspec.utils import get_protocol

        self.url = url
        self.shard_bytes = shard_bytes
        self._secrets = secret_values(dict(storage_options or {}))
        isolate_store_clients(url)
        self._fs = fsspec.filesystem(
            get_protocol(url), skip_instance_cache=True, **dict(storage_options or {})
        )
        if get_protocol(url) in ("file", "local"):  # object stores have no folders to make
            self._fs.makedirs(self._fs._strip_protocol(url), exist_ok=True)
        self._shards: list[dict[str, Any]] = []
        self._pending: list[bytes] = []
        self._pending_keys: list[str | None] = []
        self._pending_bytes = 0
        self._closed = False

    def write(self, sample: bytes, key: str | None = None) -> None:
        """Append one sample, with an optional key (its name: a relative path, an id) kept in the index."""
        if self._closed:
            raise DataError("ShardWriter.write after close()")
        self._pending.append(bytes(sample))
        self._pending_keys.append(key)
        self._pending_bytes += len(sample)
        if self._pending_bytes >= self.shard_bytes:
            self._flush()

    def close(self) -> dict[str, Any]:
        """Write the last shard and then the index; returns the index."""
        if self._closed:
            raise DataError("ShardWriter.close() called twice")
        if self._pending:
            self._flush()
        self._closed = True
        index = {
            "format": FORMAT,
            "version": 1,
            "samples": sum(s["samples"] for s in self._shards),
            "shards": self._shards,
        }
        payload = json.dumps(index, indent=1).encode()
        self._retry(lambda: self._fs.pipe_file(self._path(INDEX_NAME), payload), INDEX_NAME)
        return index

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()

    def _path(self, name: str) -> str:
        return str(self._fs._strip_protocol(join_url(self.url, name)))

    def _flush(self) -> None:
        name = f"shard-{len(self._shards):06d}.gpshard"
        offsets = [0]
        for sample in self._pending:
            offsets.append(offsets[-1] + len(sample))
        header = MAGIC + _U64.pack(len(self._pending)) + struct.pack(f"<{len(offsets)}Q", *offsets)
        digest = hashlib.md5(usedforsecurity=False)
        with tempfile.NamedTemporaryFile(prefix="goodput-shard-", delete=False) as tmp:
            for part in (header, *self._pending):
                tmp.write(part)
                digest.update(part)
            size = tmp.tell()
        try:
            self._retry(lambda: self._fs.put_file(tmp.name, self._path(name)), name)
        finally:
            os.unlink(tmp.name)
        entry: dict[str, Any] = {
            "file": name,
            "samples": len(self._pending),
            "bytes": size,
            "md5": digest.hexdigest(),
        }
        if any(key is not None for key in self._pending_keys):
            entry["keys"] = list(self._pending_keys)
        self._shards.append(entry)
        self._pending, self._pending_keys, self._pending_bytes = [], [], 0

    def _retry(self, fn: Callable[[], Any], name: str) -> None:
        call_with_retries(
            fn, url=join_url(self.url, name), policy=_WRITE_RETRY, secrets=self._secrets, verb="write"
        )


_WRITE_RETRY = RetryPolicy(attempts=6, backoff_s=0.2, max_backoff_s=5.0)


def write_shards(
    samples: Iterable[bytes],
    url: str,
    *,
    shard_bytes: int = 64 << 20,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``samples`` (bytes each, in order) as a sharded dataset at ``url``; returns the index."""
    writer = ShardWriter(url, shard_bytes=shard_bytes, storage_options=storage_options)
    for sample in samples:
        writer.write(sample)
    return writer.close()


def write_folder_shards(
    folder: str,
    url: str,
    *,
    shard_bytes: int = 64 << 20,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Turn a local folder (one sample per file, sorted by relative path) into shards at ``url``; each
    sample's key is its path relative to ``folder`` (``cat/001.jpg``), see :meth:`ShardedDataset.key`.

    Raises:
        ConfigError: when ``folder`` is not a directory or holds no files.
    """
    if not os.path.isdir(folder):
        raise ConfigError(f"{folder!r} is not a directory: give the local folder whose files are the samples")
    files = sorted(
        os.path.relpath(os.path.join(root, name), folder)
        for root, _, names in os.walk(folder)
        for name in names
    )
    if not files:
        raise ConfigError(f"{folder!r} holds no files: nothing to write")

    writer = ShardWriter(url, shard_bytes=shard_bytes, storage_options=storage_options)
    for rel in files:
        with open(os.path.join(folder, rel), "rb") as f:
            writer.write(f.read(), key=rel.replace(os.sep, "/"))
    return writer.close()


class ShardedDataset(Pieces, Generic[T]):
    """Map-style dataset over shards at any fsspec URL, read through a local cache.

    Args:
        url: the dataset folder written by ``ShardWriter``/``goodput data write``.
        cache: the local cache's settings; None reads straight from the store (or, for a local folder, from
            the files themselves).
        decode: turns a sample's bytes into what ``__getitem__`` returns (module-level, to pickle for workers).
        storage_options: passed to fsspec (credentials; never logged or shown).
        open_shards: how many shards each process keeps open (mapped and, with a cache, pinned against
            eviction), most recently used first. A shuffled order jumps between shards: re-opening one costs a
            pin in the cache's index, a mapping and a header parse, more than a whole sample. With
            ``ResumableLoader(shard_window=k)`` and ``open_shards >= k`` a shard is opened once per window.
            Each open through the cache counts one cache hit (or miss).

    Attributes:
        shard_sizes: samples per shard, contiguous in index order (for shard-aware shuffles).
    """

    _held = ("_open", "_headers")

    def __init__(
        self,
        url: str,
        *,
        cache: CacheConfig | None = None,
        decode: Callable[[bytes], T] = _identity,
        storage_options: Mapping[str, Any] | None = None,
        open_shards: int = 4,
    ) -> None:
        if not (isinstance(open_shards, int) and open_shards >= 1):
            raise ConfigError(f"open_shards must be an integer >= 1, got {open_shards!r}")
        self.open_shards = open_shards
        self._source = Source(url, cache=cache, storage_options=storage_options)
        self.decode = decode
        raw = self._source.direct(join_url(url, INDEX_NAME))
        index = json.loads(raw)
        if index.get("format") != FORMAT:
            raise DataError(
                f"{url} is not a goodput shard dataset (its {INDEX_NAME} says {index.get('format')!r})"
            )
        self._shards: list[dict[str, Any]] = index["shards"]
        self._lay_out([int(s["samples"]) for s in self._shards])
        self.fingerprint = hashlib.sha256(raw).hexdigest()[:16]
        self._reset()

    def _reset(self) -> None:
        self._open: Handles[Buffer | None] = Handles(self.open_shards)
        self._headers: dict[int, tuple[tuple[int, ...], int]] = {}  # parsed once: a shard never changes

    def __repr__(self) -> str:
        return f"ShardedDataset({self._source.url!r}, samples={len(self)}, shards={len(self._shards)})"

    def __getitem__(self, index: int) -> T:
        return self.decode(self._sample(*self.locate(index)))

    def key(self, index: int) -> str | None:
        """The key sample ``index`` was written with (``goodput data write``: its relative path), or None.

        Labels taken from file names survive sharding: ``label = train.key(i).split("/")[0]``.
        """
        shard, local = self.locate(index)
        keys = self._shards[shard].get("keys")
        return None if keys is None else keys[local]

    def shard_url(self, shard: int) -> str:
        return join_url(self._source.url, self._shards[shard]["file"])

    def prefetch(self, indices: Sequence[int]) -> None:
        """Download the shards that ``indices`` (this rank's upcoming samples, in order) need, in that order."""
        shards = self._pieces_of(indices)
        self._source.prefetch([self.shard_url(s) for s in shards], [self._info(s) for s in shards])

    def close(self) -> None:
        """Release the open shards and stop prefetching."""
        self._open.close()
        self._source.close()

    def _info(self, shard: int) -> RemoteInfo:
        entry = self._shards[shard]
        return RemoteInfo(size=int(entry["bytes"]), md5=entry.get("md5"))

    def _sample(self, shard: int, local: int) -> bytes:
        url = self.shard_url(shard)
        view = self._open.get(
            shard,
            lambda stack: stack.enter_context(self._source.buffer(url, self._info(shard), self._open.close)),
        )
        if view is None:
            return self._direct_sample(shard, local)
        if shard not in self._headers:
            self._headers[shard] = _parse_header(view[: _header_probe(view)], url)
        offsets, base = self._headers[shard]
        return view[base + offsets[local] : base + offsets[local + 1]]

    def _direct_sample(self, shard: int, local: int) -> bytes:
        url = self.shard_url(shard)
        if shard not in self._headers:
            count = _U64.unpack(self._source.direct(url, len(MAGIC), len(MAGIC) + 8))[0]
            head = self._source.direct(url, 0, _header_size(count))
            self._headers[shard] = _parse_header(head, url)
        offsets, base = self._headers[shard]
        return self._source.direct(url, base + offsets[local], base + offsets[local + 1])


def _header_size(count: int) -> int:
    return len(MAGIC) + 8 + 8 * (count + 1)


def _header_probe(view: Buffer) -> int:
    return _header_size(_U64.unpack(view[len(MAGIC) : len(MAGIC) + 8])[0])


def _parse_header(head: bytes, url: str) -> tuple[tuple[int, ...], int]:
    if head[: len(MAGIC)] != MAGIC:
        raise DataError(f"{url} is not a goodput shard (bad magic)")
    count = _U64.unpack(head[len(MAGIC) : len(MAGIC) + 8])[0]
    size = _header_size(count)
    return struct.unpack(f"<{count + 1}Q", head[len(MAGIC) + 8 : size]), size
