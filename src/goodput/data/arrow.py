"""Arrow files read in place: a Hugging Face ``datasets`` folder written by ``save_to_disk``, a loaded
``datasets.Dataset``, or any ``.arrow`` files (IPC stream or file format), by row.

A ``save_to_disk`` folder names its files, in order, in ``state.json`` (``_data_files``); without one, the
folder's ``*.arrow`` files are read in path order. Sample ``i`` is row ``i``; rows are read a record batch at a
time (see ``_tables``). Counting a stream's rows means reading its batch headers, so each file is read once
when the dataset is made: in place when local (memory-mapped, nothing copied), through the cache when remote
(the whole file, then mapped), or into memory when remote without a cache. Needs pyarrow
(``pip install 'goodput[parquet]'``; ``datasets`` only to pass a ``datasets.Dataset``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from goodput._storage_errors import secret_values
from goodput.data._files import FileSpan, list_files
from goodput.data._remote import RemoteInfo, call_with_retries, info_of
from goodput.data._source import DEFAULT_RETRY, Source, join_url
from goodput.data._tables import TableDataset, block_starts, check_columns, import_pyarrow
from goodput.data.cache import CacheConfig
from goodput.errors import ConfigError, DataError

__all__ = ["ArrowDataset"]

T = TypeVar("T")
STATE_NAME = "state.json"


class ArrowDataset(TableDataset[T]):
    """Map-style dataset over Arrow files at any fsspec URL: sample ``i`` is row ``i`` as a dict.

    Args:
        url: a ``save_to_disk`` folder, a folder of ``.arrow`` files, or one ``.arrow`` file.
        files: the files under ``url`` to read, in order (default: from ``state.json``, else all ``*.arrow``).
        columns: the columns to read (default all); a missing one is a ConfigError naming the file.
        decode: turns a row dict into the sample (module-level, to pickle for DataLoader workers).
        augment: ``augment(sample, seed)`` with the sample's per-sample seed; makes ``get_seeded`` exist.
        cache: the local cache for remote files (whole files); None reads local files in place.
        storage_options: passed to fsspec (credentials; never logged or shown).
        open_files: files each process keeps open (mapped, pinned in the cache).

    Raises:
        DataError: a file is not Arrow IPC or is truncated (naming the samples lost), or no rows were found.
        ConfigError: a column in ``columns`` is missing.
    """

    kind = "arrow"

    def __init__(
        self,
        url: str,
        *,
        files: Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
        decode: Callable[[dict[str, Any]], T] | None = None,
        augment: Callable[[T, int], T] | None = None,
        cache: CacheConfig | None = None,
        storage_options: Mapping[str, Any] | None = None,
        open_files: int = 4,
    ) -> None:
        import_pyarrow("ArrowDataset")
        source = Source(url, cache=cache, storage_options=storage_options)
        listing = _listing(source, files)
        self.decode = decode
        self.keep_blocks = 1  # unused: every batch of an open file is kept (zero-copy)
        scanned = [_scan(source, name, info) for name, info in listing]
        schema = scanned[0][0]
        self._types = {field.name: str(field.type) for field in schema}
        first = url if not listing[0][0] else join_url(url, listing[0][0])
        self.columns = check_columns(first, schema.names, columns)
        spans = [_span(name, info, rows) for (name, info), (_, rows, _) in zip(listing, scanned, strict=True)]
        self._blocks = [block_starts(rows) for _, rows, _ in scanned if sum(rows) > 0]
        self._layouts = [(schema, offsets) for schema, rows, offsets in scanned if sum(rows) > 0]
        self._setup(source, spans, augment=augment, open_files=open_files, extra=",".join(self.columns))

    @classmethod
    def from_hf(cls, dataset: Any, **options: Any) -> ArrowDataset[Any]:
        """Read a loaded ``datasets.Dataset`` through its Arrow files (``options`` as for the constructor).

        Raises:
            ConfigError: the dataset lives in memory or has an indices mapping (``select``, ``shuffle``).
        """
        if getattr(dataset, "_indices", None) is not None:
            raise ConfigError(
                "this datasets.Dataset has an indices mapping (select/shuffle/filter): call "
                "dataset.flatten_indices() first, or pass the unshuffled dataset (goodput shuffles)"
            )
        paths = [os.path.abspath(f["filename"]) for f in getattr(dataset, "cache_files", [])]
        if not paths:
            raise ConfigError(
                "this datasets.Dataset lives in memory and has no Arrow files: save_to_disk(folder) and "
                "pass the folder"
            )
        root = os.path.commonpath([os.path.dirname(p) for p in paths])
        return cls(root, files=[os.path.relpath(p, root) for p in paths], **options)

    def _all_blocks(self, file: int) -> _ArrowFile:
        found: _ArrowFile = self._handles.get(file, lambda stack: self._open(file, stack))
        return found

    def _block(self, file: int, block: int) -> Any:
        return self._all_blocks(file)[block]

    def _open(self, file: int, stack: contextlib.ExitStack) -> _ArrowFile:
        import pyarrow as pa

        path = self.local_path(file, stack)
        if path is not None:
            stream = pa.memory_map(path)
        else:
            stream = pa.BufferReader(self._source.direct(self.file_url(file)))
        schema, offsets = self._layouts[file]
        return _ArrowFile(stream, schema, offsets, self.columns, self.file_url(file))


class _ArrowFile:
    """The record batches of one open file, each read on first use from its known offset (zero-copy on a memory
    map), or all at once for a file whose batches cannot be read alone (IPC file format, dictionaries)."""

    def __init__(
        self, stream: Any, schema: Any, offsets: list[int] | None, columns: list[str], url: str
    ) -> None:
        self._stream, self._schema, self._offsets, self._columns = stream, schema, offsets, columns
        if offsets is None:
            self._batches: list[Any] = [b.select(columns) for b in _batches(stream, url)[1]]
        else:
            self._batches = [None] * len(offsets)

    def __getitem__(self, block: int) -> Any:
        found = self._batches[block]
        if found is None:
            import pyarrow as pa

            assert self._offsets is not None
            self._stream.seek(self._offsets[block])
            message = pa.ipc.read_message(self._stream)
            found = pa.ipc.read_record_batch(message, self._schema).select(self._columns)
            self._batches[block] = found
        return found


def _span(name: str, info: RemoteInfo, rows: list[int]) -> FileSpan:
    return FileSpan(name=name, size=info.size, samples=sum(rows), md5=info.md5)


def _listing(source: Source, files: Sequence[str] | None) -> list[tuple[str, RemoteInfo]]:
    """The files to read with their sizes: given, named by state.json, or every ``*.arrow``."""
    secrets = secret_values(source.options)
    if files is None:
        state_url = join_url(source.url, STATE_NAME)
        if source.url.endswith(".arrow"):
            files = None
        elif source.fs.exists(source.local_path(state_url)):
            try:
                files = [entry["filename"] for entry in json.loads(source.direct(state_url))["_data_files"]]
            except (ValueError, KeyError, TypeError):
                raise DataError(
                    f"{state_url} is not a datasets save_to_disk state (no _data_files list): "
                    "pass files= or save the dataset again"
                ) from None
    if files is None:
        found = list_files(source, (".arrow",))
        if not found:
            raise DataError(f"{source.url} holds no .arrow files (and no {STATE_NAME})")
        return found
    listing = []
    for name in files:
        url = join_url(source.url, name)
        path = source.local_path(url)

        def info(p: str = path) -> RemoteInfo:
            return info_of(source.fs, p)

        listing.append((name, call_with_retries(info, url=url, policy=DEFAULT_RETRY, secrets=secrets)))
    return listing


def _scan(source: Source, name: str, info: RemoteInfo) -> tuple[Any, list[int], list[int] | None]:
    """The schema, each record batch's rows and where each batch starts (None when the batches cannot be
    read alone) of one file (read once: see the module's docstring)."""
    import pyarrow as pa

    url = source.url if not name else join_url(source.url, name)
    if source.is_local:
        with pa.memory_map(source.local_path(url)) as mapped:
            return _index(mapped, url)
    cache = source.cache
    if cache is not None:
        with cache.open(url, expected=info) as path, pa.memory_map(path) as mapped:
            return _index(mapped, url)
    return _index(pa.BufferReader(source.direct(url)), url)


def _index(stream: Any, url: str) -> tuple[Any, list[int], list[int] | None]:
    """Walk an IPC stream's messages: the schema, then each record batch's offset and rows. Anything else
    (an IPC file, dictionary batches) falls back to reading every batch."""
    import pyarrow as pa

    rows: list[int] = []
    offsets: list[int] = []
    try:
        reader = pa.ipc.MessageReader.open_stream(stream)
        first = reader.read_next_message()
        if first.type != "schema":
            raise pa.ArrowInvalid(f"first message is a {first.type}")
        schema = pa.ipc.read_schema(first)
    except (pa.ArrowInvalid, OSError, StopIteration):
        return _fallback(stream, url)
    while True:
        at = stream.tell()
        try:
            message = reader.read_next_message()
            if message.type != "record batch":
                return _fallback(stream, url)
            rows.append(pa.ipc.read_record_batch(message, schema).num_rows)
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError) as err:
            raise DataError(
                f"{url} is truncated after {sum(rows)} rows ({len(rows)} whole record batches; "
                f"{str(err).splitlines()[0]}): the rows after it are lost, copy or save the dataset again"
            ) from None
        offsets.append(at)
    return schema, rows, offsets


def _fallback(stream: Any, url: str) -> tuple[Any, list[int], None]:
    stream.seek(0)
    schema, batches = _batches(stream, url)
    return schema, [b.num_rows for b in batches], None


def _batches(stream: Any, url: str) -> tuple[Any, list[Any]]:
    """Schema and record batches of an Arrow IPC stream (what ``datasets`` writes) or IPC file; the batches
    point into ``stream`` (zero-copy on a memory map). A cut-short file names the rows it still holds."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(stream)
    except pa.ArrowInvalid:
        stream.seek(0)
        try:
            file_reader = pa.ipc.open_file(stream)
        except pa.ArrowInvalid as err:
            raise DataError(
                f"{url} is not an Arrow IPC file ({str(err).splitlines()[0]}): pass the folder written by "
                "save_to_disk, or .arrow files"
            ) from None
        batches = [file_reader.get_batch(i) for i in range(file_reader.num_record_batches)]
        return file_reader.schema, batches
    batches = []
    try:
        for batch in reader:
            batches.append(batch)
    except (pa.ArrowInvalid, OSError) as err:
        rows = sum(b.num_rows for b in batches)
        raise DataError(
            f"{url} is truncated after {rows} rows ({len(batches)} whole record batches; "
            f"{str(err).splitlines()[0]}): the rows after it are lost, copy or save the dataset again"
        ) from None
    return reader.schema, batches
