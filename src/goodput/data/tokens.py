"""Flat token files read in place as fixed windows: ``.bin`` (raw, as nanoGPT writes) and ``.npy``.

A file is one stream of token ids. Sample ``k`` of a file is its tokens ``[k (L + 1), (k + 1)(L + 1))`` for
``seq_len = L``: non-overlapping windows of ``L + 1`` tokens, so ``x, y = w[:-1], w[1:]`` gives inputs and
targets and no token is read twice in an epoch. Windows never span two files (each file is its own stream); the
tokens at a file's end that do not fill a window are not read. The global sample index runs over the files in
path order. Local files are memory-mapped; remote ones are read with one ranged request per window, or, with a
cache, downloaded whole in the sampler's order and mapped. A ``.bin`` file's dtype is given; a ``.npy`` file's
dtype and shape come from its header (any shape, read flat in C order).
"""

from __future__ import annotations

import contextlib
import io
import mmap
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from goodput.data._files import FileDataset, FileSpan, list_files
from goodput.data._remote import RemoteInfo
from goodput.data._source import Source, join_url
from goodput.data.cache import CacheConfig
from goodput.errors import ConfigError, DataError

__all__ = ["TokenDataset"]

T = TypeVar("T")
_SUFFIXES = (".bin", ".npy")
_HEADER_PROBE = 4096


def _to_tensor(window: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(window.astype(np.int64))


class TokenDataset(FileDataset[T]):
    """Map-style dataset over token files at any fsspec URL: sample ``i`` is a window of ``seq_len + 1`` ids.

    Args:
        url: a ``.bin``/``.npy`` file or a folder of them (searched recursively, path order).
        seq_len: tokens per training sequence; each sample holds ``seq_len + 1``.
        dtype: the ``.bin`` files' token dtype (``"uint16"`` as nanoGPT writes); checked against ``.npy``
            headers when given.
        decode: turns a window (a numpy array) into the sample; default an int64 torch tensor.
        augment: ``augment(sample, seed)`` with the sample's per-sample seed; makes ``get_seeded`` exist.
        cache: the local cache for remote files (whole files); None reads remote windows by ranged requests.
        storage_options: passed to fsspec (credentials; never logged or shown).
        open_files: files each process keeps mapped (pinned in the cache).

    Raises:
        ConfigError: a bad ``seq_len``/``dtype``, or ``.bin`` files without a dtype.
        DataError: a file is not what its name says, is truncated (naming the samples lost), or no file
            holds a whole window.
    """

    kind = "tokens"

    def __init__(
        self,
        url: str,
        *,
        seq_len: int,
        dtype: str | None = None,
        decode: Callable[[np.ndarray], T] = _to_tensor,
        augment: Callable[[T, int], T] | None = None,
        cache: CacheConfig | None = None,
        storage_options: Mapping[str, Any] | None = None,
        open_files: int = 4,
    ) -> None:
        if not (isinstance(seq_len, int) and seq_len >= 1):
            raise ConfigError(f"seq_len must be an integer >= 1, got {seq_len!r}")
        given = _integer_dtype(dtype, "dtype") if dtype is not None else None
        source = Source(url, cache=cache, storage_options=storage_options)
        listing = list_files(source, _SUFFIXES)
        if not listing:
            raise DataError(f"{url} holds no .bin or .npy token files")
        self.seq_len = seq_len
        self.decode = decode
        spans: list[FileSpan] = []
        layouts: list[tuple[int, str]] = []
        first_sample = 0
        for name, info in listing:
            file_url = url if not name else join_url(url, name)
            offset, kind, tokens = _layout(source, file_url, info, given)
            windows = tokens // (seq_len + 1)
            _check_size(file_url, info.size, offset, kind, tokens, seq_len, first_sample)
            spans.append(FileSpan(name=name, size=info.size, samples=windows, md5=info.md5))
            if windows:
                layouts.append((offset, kind))
            first_sample += windows
        self._layouts = layouts
        self._dtypes = sorted({np.dtype(kind).name for _, kind in layouts})
        self._setup(source, spans, augment=augment, open_files=open_files, extra=f"seq_len={seq_len}")

    def _load(self, file: int, local: int) -> T:
        return self.decode(self._window(file, local))

    def __getitems__(self, indices: Sequence[int]) -> list[T]:
        """Windows ``indices`` (a DataLoader batch): one gather per mapped file, one int64 conversion."""
        if self.decode is not _to_tensor:
            return [self[int(i)] for i in indices]
        import torch

        found = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
        by_file: dict[int, tuple[list[int], list[int]]] = {}
        for slot, index in enumerate(indices):
            file, local = self.locate(int(index))
            slots, locals_ = by_file.setdefault(file, ([], []))
            slots.append(slot)
            locals_.append(local)
        for file, (slots, locals_) in by_file.items():
            windows = self._windows(file)
            if windows is None:  # remote without a cache: one ranged read per window
                found[slots] = [self._window(file, local) for local in locals_]
            else:
                found[slots] = windows[locals_]
        return list(torch.from_numpy(found))

    def _windows(self, file: int) -> np.ndarray | None:
        found: np.ndarray | None = self._handles.get(file, lambda stack: self._map(file, stack))
        return found

    def _window(self, file: int, local: int) -> np.ndarray:
        windows = self._windows(file)
        if windows is not None:
            return np.asarray(windows[local])
        offset, kind = self._layouts[file]
        size = (self.seq_len + 1) * np.dtype(kind).itemsize
        start = offset + local * size
        return np.frombuffer(self._source.direct(self.file_url(file), start, start + size), dtype=kind)

    def _map(self, file: int, stack: contextlib.ExitStack) -> np.ndarray | None:
        """The file's windows as a (windows, seq_len + 1) array over a memory map of the file (a local file
        or the cache's copy); None: read by ranged requests."""
        path = self.local_path(file, stack)
        if path is None:
            return None
        offset, kind = self._layouts[file]
        width = self.seq_len + 1
        with open(path, "rb") as f:
            # unmapped when the last array over it is gone (a window a decode kept may outlive the handle)
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        count = self.shard_sizes[file] * width
        return np.frombuffer(mapped, dtype=kind, count=count, offset=offset).reshape(-1, width)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "dtype": ",".join(self._dtypes), "seq_len": self.seq_len}


def _integer_dtype(name: str, what: str) -> str:
    try:
        kind = np.dtype(name)
    except TypeError:
        raise ConfigError(f"{what} {name!r} is not a numpy dtype: pass e.g. 'uint16' or 'int32'") from None
    if kind.kind not in "ui":
        raise ConfigError(f"{what} must be an integer dtype for token ids, got {name!r}")
    return kind.newbyteorder("<").str if kind.byteorder == ">" else kind.str


def _layout(source: Source, url: str, info: RemoteInfo, given: str | None) -> tuple[int, str, int]:
    """(data offset, dtype, tokens) of one file: from the ``.npy`` header, or ``dtype`` for ``.bin``."""
    if url.endswith(".bin"):
        if given is None:
            raise ConfigError(
                f"{url} is a raw .bin token file: pass dtype= (e.g. 'uint16' as nanoGPT writes)"
            )
        size = np.dtype(given).itemsize
        if info.size % size:
            raise DataError(
                f"{url} is {info.size} bytes, not a whole number of {np.dtype(given).name} tokens: it is "
                "truncated mid-token or dtype= is wrong"
            )
        return 0, given, info.size // size
    head = _read_head(source, url, min(info.size, _HEADER_PROBE))
    try:
        major, minor, shape, fortran, kind = _parse_npy(head)
    except ValueError:
        if len(head) == _HEADER_PROBE:  # a header longer than the probe: read it whole and try again
            head = _read_head(source, url, min(info.size, 1 << 20))
        try:
            major, minor, shape, fortran, kind = _parse_npy(head)
        except ValueError as err:
            raise DataError(f"{url} is not a .npy file ({err}): save it with numpy.save") from None
    if fortran and len(shape) > 1:
        raise DataError(f"{url} is stored in Fortran order: save it C-ordered (np.ascontiguousarray)")
    name = _integer_dtype(kind.str, f"{url} has dtype")
    if given is not None and name != given:
        raise DataError(
            f"{url} holds {np.dtype(name).name} tokens but dtype={np.dtype(given).name!r} was given"
        )
    return _header_end(head, major, minor), name, int(np.prod(shape, dtype=np.int64))


def _read_head(source: Source, url: str, size: int) -> bytes:
    if source.is_local:
        with open(source.local_path(url), "rb") as f:
            return f.read(size)
    return source.direct(url, 0, size)


def _parse_npy(head: bytes) -> tuple[int, int, tuple[int, ...], bool, np.dtype[Any]]:
    stream = io.BytesIO(head)
    major, minor = np.lib.format.read_magic(stream)
    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape, fortran, kind = read(stream)
    return major, minor, tuple(shape), bool(fortran), kind


def _header_end(head: bytes, major: int, minor: int) -> int:
    length_bytes = 2 if major == 1 else 4
    length = int.from_bytes(head[8 : 8 + length_bytes], "little")
    return 8 + length_bytes + length


def _check_size(
    url: str, size: int, offset: int, kind: str, tokens: int, seq_len: int, first_sample: int
) -> None:
    """A file shorter than its header promises names the samples it cannot give."""
    held = max(0, (size - offset) // np.dtype(kind).itemsize)
    if held >= tokens:
        return
    width = seq_len + 1
    whole, promised = held // width, tokens // width
    lost = (
        f"samples {first_sample + whole}..{first_sample + promised - 1}" if promised > whole else "no sample"
    )
    raise DataError(
        f"{url} is truncated: its header promises {tokens} tokens, it holds {held} ({lost} affected): "
        "copy the file again"
    )
