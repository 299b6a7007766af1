"""Parquet files read in place: one file, a folder of them, or a Hugging Face Hub export, by row.

The Hub's parquet exports put a split's files under ``data/`` (``data/train-00000-of-00003.parquet``) or under a
folder named for the split (``train/0000.parquet``); ``split="train"`` keeps those. Sample ``i`` is row ``i``
of the files in path order; rows are read a row group at a time (see ``_tables``). The footers of all files are
read once, when the dataset is made (a ranged read each); the row groups' rows travel with the dataset to
DataLoader workers. Remote files go through the cache whole, downloaded in the sampler's order (``prefetch``);
without a cache a remote file is read with ranged requests, one row group's column chunks at a time.
Needs pyarrow (``pip install 'goodput[parquet]'``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from goodput._storage_errors import secret_values
from goodput.data._files import FileSpan, list_files
from goodput.data._remote import RemoteInfo, call_with_retries
from goodput.data._source import DEFAULT_RETRY, Source
from goodput.data._tables import TableDataset, block_starts, check_columns, check_keep, import_pyarrow
from goodput.data.cache import CacheConfig
from goodput.errors import DataError

__all__ = ["ParquetDataset"]

T = TypeVar("T")


class ParquetDataset(TableDataset[T]):
    """Map-style dataset over Parquet files at any fsspec URL: sample ``i`` is row ``i`` as a dict.

    Args:
        url: a ``.parquet`` file or a folder (searched recursively for ``*.parquet``).
        columns: the columns to read (default all); a missing one is a ConfigError naming the file.
        split: keep only a Hub split's files (``train-*.parquet`` or ``train/*.parquet``).
        decode: turns a row dict into the sample (module-level, to pickle for DataLoader workers).
        augment: ``augment(sample, seed)`` with the sample's per-sample seed; makes ``get_seeded`` exist.
        cache: the local cache for remote files (whole files, in the sampler's order); None reads in place.
        storage_options: passed to fsspec (credentials; never logged or shown).
        open_files: files each process keeps open (pinned in the cache).
        keep_row_groups: decoded row groups each process keeps.

    Raises:
        DataError: a file is not Parquet (or is truncated), or no rows were found.
        ConfigError: a column in ``columns`` is missing.
    """

    kind = "parquet"

    def __init__(
        self,
        url: str,
        *,
        columns: Sequence[str] | None = None,
        split: str | None = None,
        decode: Callable[[dict[str, Any]], T] | None = None,
        augment: Callable[[T, int], T] | None = None,
        cache: CacheConfig | None = None,
        storage_options: Mapping[str, Any] | None = None,
        open_files: int = 4,
        keep_row_groups: int = 4,
    ) -> None:
        import_pyarrow("ParquetDataset")
        source = Source(url, cache=cache, storage_options=storage_options)
        files = list_files(source, (".parquet",))
        if split is not None:
            files = [(n, i) for n, i in files if _in_split(n, split)]
        if not files:
            where = f" for split {split!r}" if split is not None else ""
            raise DataError(f"{url} holds no .parquet files{where}")
        metas = [_metadata(source, name, info) for name, info in files]
        schema = metas[0].schema.to_arrow_schema()
        self._types = {field.name: str(field.type) for field in schema}
        self.columns = check_columns(_file_url(url, files[0][0]), schema.names, columns)
        for (name, _), meta in zip(files[1:], metas[1:], strict=True):
            check_columns(_file_url(url, name), meta.schema.to_arrow_schema().names, self.columns)
        self.decode = decode
        self.keep_blocks = check_keep("keep_row_groups", keep_row_groups)
        spans = [
            FileSpan(name=n, size=i.size, samples=m.num_rows, md5=i.md5)
            for (n, i), m in zip(files, metas, strict=True)
        ]
        self._blocks = [
            block_starts([m.row_group(g).num_rows for g in range(m.num_row_groups)])
            for m, s in zip(metas, spans, strict=True)
            if s.samples > 0
        ]
        self._setup(source, spans, augment=augment, open_files=open_files, extra=",".join(self.columns))

    def _read(self, file: int, block: int) -> Any:
        reader = self._handles.get(file, lambda stack: self._open(file, stack))
        table = reader.read_row_group(block, columns=self.columns).combine_chunks()
        batches = table.to_batches()
        if batches:
            return batches[0]
        import pyarrow as pa

        return pa.RecordBatch.from_pylist([], schema=table.schema)

    def _open(self, file: int, stack: contextlib.ExitStack) -> Any:
        import pyarrow.parquet as pq

        path = self.local_path(file, stack)
        if path is not None:
            return pq.ParquetFile(path, memory_map=True)
        url = self.file_url(file)
        handle = stack.enter_context(self._source.fs.open(self._source.local_path(url), "rb"))
        return pq.ParquetFile(handle)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "row_groups": sum(len(b) - 1 for b in self._blocks)}


def _in_split(name: str, split: str) -> bool:
    parts = name.split("/")
    return parts[-1].startswith(f"{split}-") or split in parts[:-1]


def _file_url(url: str, name: str) -> str:
    return url if not name else url.rstrip("/") + "/" + name


def _metadata(source: Source, name: str, info: RemoteInfo) -> Any:
    """The footer of one file; a file that is not Parquet (or is cut short) is a one-line DataError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    url = _file_url(source.url, name)

    def read() -> Any:
        try:
            if source.is_local:
                return pq.read_metadata(source.local_path(url))
            with source.fs.open(source.local_path(url), "rb") as f:
                return pq.read_metadata(f)
        except pa.ArrowException as err:  # returned, not raised: a bad file is not worth retrying
            return err

    found = call_with_retries(read, url=url, policy=DEFAULT_RETRY, secrets=secret_values(source.options))
    if isinstance(found, pa.ArrowException):
        raise DataError(
            f"{url} is not a Parquet file or is truncated ({info.size} bytes; "
            f"{str(found).splitlines()[0]}): copy it again or remove it from the folder"
        )
    return found
