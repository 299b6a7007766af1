"""Row access for the columnar formats (Parquet row groups, Arrow record batches): one block read at a time.

A file is a list of blocks (row groups, record batches) of known row counts. Reading row ``r`` reads its whole
block (as Arrow columns: a memory map's zero-copy batch, or a decoded row group) and keeps the newest
``keep_blocks`` of them, so an order that stays within a few files (``ResumableLoader(shard_window=k)``) or runs
in sequence pays one block read per block, not one per row. A batch (the DataLoader's ``__getitems__``) takes a
zero-copy slice of each row and turns them all into Python at once. A row is a dict ``{column: value}``, passed
through ``decode`` when one is given. Needs pyarrow (``pip install 'goodput[parquet]'``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from goodput.data._files import FileDataset
from goodput.errors import ConfigError, DataError

T = TypeVar("T")


def import_pyarrow(what: str) -> Any:
    """pyarrow, or a one-line ConfigError saying which extra installs it."""
    try:
        import pyarrow
    except ModuleNotFoundError:
        raise ConfigError(f"{what} needs pyarrow: pip install 'goodput[parquet]'") from None
    return pyarrow


def check_columns(url: str, available: Sequence[str], columns: Sequence[str] | None) -> list[str]:
    """The columns to read (all when ``columns`` is None); a missing one is a one-line ConfigError."""
    if columns is None:
        return list(available)
    missing = [c for c in columns if c not in available]
    if missing:
        raise ConfigError(
            f"{url} has no column {', '.join(map(repr, missing))}; its columns are {', '.join(available)}: "
            "pass columns= from those"
        )
    return list(columns)


class TableDataset(FileDataset[T]):
    """A FileDataset whose files are blocks of rows; subclasses set ``_blocks`` and implement ``_read``."""

    columns: list[str]
    decode: Callable[[dict[str, Any]], T] | None
    keep_blocks: int
    _blocks: list[list[int]]  # per file: the starting row of each block, then the file's row count
    _types: dict[str, str]

    def _reset(self) -> None:
        super()._reset()
        self._arrow: OrderedDict[tuple[int, int], Any] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_arrow", None)
        return state

    def _load(self, file: int, local: int) -> T:
        starts = self._blocks[file]
        block = bisect_right(starts, local) - 1
        row = self._block(file, block).slice(local - starts[block], 1).to_pylist()[0]
        return row if self.decode is None else self.decode(row)

    def __getitems__(self, indices: Sequence[int]) -> list[T]:
        """Rows ``indices`` (a DataLoader batch): a zero-copy slice of each row's block, turned into Python
        in one conversion."""
        pa = import_pyarrow(type(self).__name__)
        starts, size, slices = self._starts, len(self), []
        whole: dict[int, Any] = {}  # files whose blocks are all held (Arrow maps), for this batch
        for index in indices:
            index = int(index)
            if not 0 <= index < size:
                raise IndexError(f"sample {index} is outside 0..{size - 1}")
            file = bisect_right(starts, index) - 1
            local = index - starts[file]
            blocks = self._blocks[file]
            block = bisect_right(blocks, local) - 1
            held = whole.get(file)
            if held is None:
                held = self._all_blocks(file)
                if held is not None:
                    whole[file] = held
            found = held[block] if held is not None else self._block(file, block)
            slices.append(found.slice(local - blocks[block], 1))
        try:
            rows = pa.Table.from_batches(slices).to_pylist()
        except pa.ArrowInvalid:  # files whose column types differ: convert row by row
            rows = [row.to_pylist()[0] for row in slices]
        return rows if self.decode is None else [self.decode(row) for row in rows]

    def _all_blocks(self, file: int) -> Any:
        """The blocks of ``file`` indexable by number, when a format holds them at no cost (None: read them one
        by one through the kept blocks)."""
        return None

    def _block(self, file: int, block: int) -> Any:
        key = (file, block)
        found = self._arrow.get(key)
        if found is not None:
            self._arrow.move_to_end(key)
            return found
        pa = import_pyarrow(type(self).__name__)
        try:
            found = self._read(file, block)
        except (pa.ArrowException, OSError) as err:
            if isinstance(err, OSError) and not (self._source.is_local or self._source.cache_config):
                raise  # a remote read without a cache: the store failed, not (known to be) the file
            first, last = self._block_samples(file, block)
            raise DataError(
                f"{self.file_url(file)}: block {block} (samples {first}..{last}) cannot be read "
                f"({str(err).splitlines()[0]}): the file is damaged, copy it again"
            ) from None
        while len(self._arrow) >= self.keep_blocks:
            self._arrow.popitem(last=False)
        self._arrow[key] = found
        return found

    def _block_samples(self, file: int, block: int) -> tuple[int, int]:
        base = self.file_samples(file).start
        starts = self._blocks[file]
        return base + starts[block], base + starts[block + 1] - 1

    def _read(self, file: int, block: int) -> Any:
        """Block ``block`` of file ``file`` as one pyarrow RecordBatch with ``self.columns``."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "columns": {name: self._types[name] for name in self.columns}}


def block_starts(rows: Sequence[int]) -> list[int]:
    """``[0, r0, r0 + r1, ...]``: the first row of each block and then the total."""
    starts = [0]
    for n in rows:
        starts.append(starts[-1] + int(n))
    return starts


def check_keep(name: str, value: int) -> int:
    if not (isinstance(value, int) and value >= 1):
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return value
