"""Mosaic MDS datasets (``mosaicml-streaming``'s MDSWriter output) read in place, without Mosaic's library.

The layout, from the format's documentation: ``index.json`` lists the shards (``{"version": 2, "shards":
[...]}``), each with its columns (names, encodings, fixed sizes or null), its sample count and its file
(``raw_data``; ``zip_data`` too when ``compression`` is set, e.g. ``zstd:7``: then only the compressed file
need exist). A raw shard is ``n`` (uint32), ``n + 1`` absolute sample offsets (uint32), the writer's config and
the samples; a sample is one uint32 size per variable-size column, then the columns' bytes in order. Columns
decode as Mosaic does for the safe encodings (bytes, str, int, numpy scalars, str_int/str_float/str_decimal,
json, ndarray); image and pickled columns come back as their raw bytes (nothing is unpickled). The hashes the
writer recorded are checked when a compressed shard is opened (a raw one is checked by its size).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import json
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, TypeVar

import numpy as np

from goodput.data._files import FileDataset, FileSpan
from goodput.data._source import Buffer, Source, join_url
from goodput.data.cache import CacheConfig
from goodput.errors import ConfigError, DataError

__all__ = ["MDSDataset"]

T = TypeVar("T")
INDEX_NAME = "index.json"
_SCALARS = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")
_FLOATS = ("float16", "float32", "float64")
_NDARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32"}
_NDARRAY_DTYPES.update({34: "float32", 64: "uint64", 65: "int64", 66: "float64"})


def _identity(sample: dict[str, Any]) -> Any:
    return sample


class MDSDataset(FileDataset[T]):
    """Map-style dataset over an MDS dataset at any fsspec URL: sample ``i`` is a dict column -> value.

    Args:
        url: the folder holding ``index.json`` and the shards.
        columns: the columns to return (None: all); an unknown one is a ConfigError naming the columns.
        decode: turns the sample dict into what ``__getitem__`` returns (module-level, to pickle for workers).
        augment: ``augment(sample, seed)`` with the sample's per-sample seed; makes ``get_seeded`` exist.
        cache: the local cache for remote shards; None reads raw remote shards by ranged requests (and
            compressed ones whole).
        storage_options: passed to fsspec (credentials; never logged or shown).
        open_files: shards each process keeps open (pinned in the cache; compressed ones decompressed).

    Raises:
        DataError: ``index.json`` is missing or not an MDS index, a shard is truncated (naming its samples),
            or its hash or compression does not match the index.
    """

    kind = "mds"

    def __init__(
        self,
        url: str,
        *,
        columns: list[str] | None = None,
        decode: Callable[[dict[str, Any]], T] = _identity,
        augment: Callable[[T, int], T] | None = None,
        cache: CacheConfig | None = None,
        storage_options: Mapping[str, Any] | None = None,
        open_files: int = 4,
    ) -> None:
        source = Source(url, cache=cache, storage_options=storage_options)
        raw = source.direct(join_url(url, INDEX_NAME))
        try:
            index = json.loads(raw)
            shards = [s for s in index["shards"] if s.get("format") == "mds"]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DataError(f"{join_url(url, INDEX_NAME)} is not an MDS index (no shards list)") from None
        if not shards:
            raise DataError(f"{join_url(url, INDEX_NAME)} lists no MDS shards")
        names = list(shards[0]["column_names"])
        if columns is not None:
            unknown = sorted(set(columns) - set(names))
            if unknown:
                raise ConfigError(
                    f"{url} has no column {', '.join(unknown)}: its columns are {', '.join(names)}"
                )
        self.columns = list(columns) if columns is not None else names
        self.decode = decode
        self._shards = shards
        spans = [_span(s) for s in shards]
        digest = hashlib.sha256(raw).hexdigest()[:16]
        self._setup(source, spans, augment=augment, open_files=open_files, extra=f"{digest}:{self.columns}")

    def _load(self, file: int, local: int) -> T:
        shard = self._shards[file]
        data = self._handles.get(file, lambda stack: self._open(file, stack))
        url = self.file_url(file)
        if data is None:  # a raw shard, remote, no cache: ranged reads
            begin, end = np.frombuffer(self._source.direct(url, 4 + 4 * local, 12 + 4 * local), np.uint32)
            chunk = self._source.direct(url, int(begin), int(end))
        else:
            begin, end = np.frombuffer(data[4 + 4 * local : 12 + 4 * local], np.uint32)
            chunk = data[int(begin) : int(end)]
        if len(chunk) != int(end) - int(begin) or end < begin:
            first = self.file_samples(file).start
            raise DataError(
                f"{url} is truncated: sample {first + local} (sample {local} of the shard) is cut off"
            )
        return self.decode(_decode_sample(shard, bytes(chunk), self.columns))

    def _open(self, file: int, stack: contextlib.ExitStack) -> Buffer | None:
        shard, url = self._shards[file], self.file_url(file)
        data = self.buffer(file, stack)
        if shard.get("zip_data"):
            packed = self._source.direct(url) if data is None else data[:]
            _check_hashes(shard["zip_data"], packed, url)
            data = _decompress(shard["compression"], packed, url)
            _check_hashes(shard["raw_data"], data, url)
        elif data is not None and len(data) != shard["raw_data"]["bytes"]:
            first = self.file_samples(file)
            raise DataError(
                f"{url} has {len(data)} of its {shard['raw_data']['bytes']} bytes: it is truncated; samples "
                f"{first.start}..{first.stop - 1} are in it"
            )
        return data

    def describe(self) -> dict[str, Any]:
        first = self._shards[0]
        kinds = dict(zip(first["column_names"], first["column_encodings"], strict=True))
        return {**super().describe(), "columns": {c: kinds[c] for c in self.columns}}


def _span(shard: Mapping[str, Any]) -> FileSpan:
    stored = shard.get("zip_data") or shard["raw_data"]
    return FileSpan(name=stored["basename"], size=int(stored["bytes"]), samples=int(shard["samples"]))


def _check_hashes(stored: Mapping[str, Any], data: Buffer | bytes, url: str) -> None:
    """Check the hashes MDSWriter recorded (hashlib's and xxhash's names) against ``data``."""
    for algo, expected in (stored.get("hashes") or {}).items():
        if algo in hashlib.algorithms_available:
            found = hashlib.new(algo, data).hexdigest()
        else:
            import xxhash

            found = getattr(xxhash, algo)(data).hexdigest()
        if found != expected:
            raise DataError(
                f"{url}: its {algo} hash differs from index.json's: the shard changed or is damaged"
            )


def _decompress(compression: str, data: bytes, url: str) -> bytes:
    algo = compression.split(":", 1)[0]
    try:
        if algo == "gz":
            return gzip.decompress(data)
        if algo == "bz2":
            return bz2.decompress(data)
        if algo == "zstd":
            try:
                import zstandard
            except ImportError:
                raise ConfigError(f"{url} is zstd-compressed: pip install 'goodput[mds]'") from None
            return bytes(zstandard.ZstdDecompressor().decompress(data))
    except (OSError, EOFError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        raise DataError(f"{url} does not decompress as {algo} ({err}): it is truncated or damaged") from None
    raise ConfigError(
        f"{url} uses {algo!r} compression, which goodput does not read (it reads gz, bz2, zstd)"
    )


def _decode_sample(shard: Mapping[str, Any], data: bytes, wanted: list[str]) -> dict[str, Any]:
    names, encodings, fixed = shard["column_names"], shard["column_encodings"], shard["column_sizes"]
    sizes, pos = [], 0
    for size in fixed:
        if size is None:
            sizes.append(int(np.frombuffer(data[pos : pos + 4], np.uint32)[0]))
            pos += 4
        else:
            sizes.append(int(size))
    sample: dict[str, Any] = {}
    for name, encoding, size in zip(names, encodings, sizes, strict=True):
        if name in wanted:
            sample[name] = _decode_value(encoding, data[pos : pos + size])
        pos += size
    return sample


def _decode_value(encoding: str, data: bytes) -> Any:
    name, _, config = encoding.partition(":")
    if name in ("str", "str_int", "str_float", "str_decimal", "json"):
        text = data.decode("utf-8")
        kinds: dict[str, Callable[[str], Any]] = {"str_int": int, "str_float": float, "str_decimal": Decimal}
        return json.loads(text) if name == "json" else kinds.get(name, str)(text)
    if name == "int":
        return int(np.frombuffer(data, np.int64)[0])
    if name in _SCALARS or name in _FLOATS:
        return np.frombuffer(data, name)[0]
    if name == "ndarray":
        return _decode_ndarray(config, data)
    return data  # bytes, and image or pickled columns as their raw bytes


def _decode_ndarray(config: str, data: bytes) -> np.ndarray:
    parts = config.split(":") if config else []
    pos = 0
    if parts:
        dtype = parts[0]
    else:
        dtype, pos = _NDARRAY_DTYPES[data[0]], 1
    if len(parts) == 2:
        shape: tuple[int, ...] = tuple(int(d) for d in parts[1].split(","))
    else:
        ndim, width = data[pos] >> 2, 2 ** (data[pos] % 4)
        shape_dtype = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}[width]
        shape = tuple(int(d) for d in np.frombuffer(data[pos + 1 : pos + 1 + ndim * width], shape_dtype))
        pos += 1 + ndim * width
    return np.frombuffer(data[pos:], dtype).reshape(shape)
