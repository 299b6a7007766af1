"""What every in-place format shares: samples that lie in a list of files, contiguous in index order.

A format (Parquet, Arrow, token files; WebDataset tar and MDS alike) lists its files once, when the dataset is
made, says how many samples each holds, and reads sample ``local`` of file ``f``. This module does the rest the
same way for all of them: the global index -> (file, local) map, ``shard_sizes`` (one file is one shard, for
``ResumableLoader(shard_window=k)``), a fingerprint of the listing for the saved position, whole-file prefetch
through the cache in the sampler's order, a bounded set of open (pinned) files per process, the per-sample
seed hook (``get_seeded`` exists only when an ``augment`` is given) and pickling for DataLoader workers.
"""

from __future__ import annotations

import contextlib
import hashlib
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from goodput._storage_errors import secret_values
from goodput.data._remote import RemoteInfo, call_with_retries, md5_from_details
from goodput.data._source import DEFAULT_RETRY, Buffer, OnSource, Source, join_url
from goodput.errors import ConfigError, DataError

T = TypeVar("T")
V = TypeVar("V")


@dataclass(frozen=True)
class FileSpan:
    """One file of a dataset: its name under the base URL, its size and MD5 (when known), its samples."""

    name: str
    size: int
    samples: int
    md5: str | None = None


def list_files(source: Source, suffixes: tuple[str, ...]) -> list[tuple[str, RemoteInfo]]:
    """The files under ``source.url`` whose names end with ``suffixes`` (sorted), or the URL itself when it
    names one file. Names are relative to the base URL (``""`` for the URL itself)."""
    fs = source.fs
    root = str(fs._strip_protocol(source.url)).rstrip("/")
    policy, secrets = DEFAULT_RETRY, secret_values(source.options)

    info: dict[str, Any] = call_with_retries(
        lambda: fs.info(root), url=source.url, policy=policy, secrets=secrets, verb="list"
    )
    if info.get("type") == "file":
        return [("", RemoteInfo(size=int(info["size"]), md5=md5_from_details(info)))]
    found: dict[str, dict[str, Any]] = call_with_retries(
        lambda: fs.find(root, detail=True), url=source.url, policy=policy, secrets=secrets, verb="list"
    )
    files = []
    for path, details in sorted(found.items()):
        name = path[len(root) :].lstrip("/")
        if details.get("type", "file") == "file" and name.endswith(suffixes):
            files.append((name, RemoteInfo(size=int(details["size"]), md5=md5_from_details(details))))
    return files


def listing_fingerprint(kind: str, spans: Sequence[FileSpan], extra: str = "") -> str:
    """``kind:files:samples:hash`` of the listing (names, sizes, samples) and the reading options, so that a
    position saved for other data (or the same files read differently) is refused with a readable reason."""
    text = "\n".join(f"{s.name}\t{s.size}\t{s.samples}" for s in spans) + "\n" + extra
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{kind}:{len(spans)}files:{sum(s.samples for s in spans)}samples:{digest}"


class Handles(Generic[V]):
    """At most ``limit`` open things (mapped files, readers), most recently used last; each closes with its
    ExitStack (which also releases the cache's pin on the file)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: OrderedDict[Any, tuple[contextlib.ExitStack, V]] = OrderedDict()

    def get(self, key: Any, make: Callable[[contextlib.ExitStack], V]) -> V:
        held = self._open.get(key)
        if held is not None:
            self._open.move_to_end(key)
            return held[1]
        while len(self._open) >= self.limit:
            self._open.popitem(last=False)[1][0].close()
        stack = contextlib.ExitStack()
        try:
            value = make(stack)
        except BaseException:
            stack.close()
            raise
        self._open[key] = (stack, value)
        return value

    def close(self) -> None:
        while self._open:
            self._open.popitem(last=False)[1][0].close()


class Pieces(OnSource):
    """A dataset of pieces (files or shards) laid end to end, ``shard_sizes`` samples each. ``_reset``
    (re)creates what one process holds open, the attributes named in ``_held``: they are left out of a pickle
    and made again after unpickling."""

    _held: tuple[str, ...] = ()

    def _lay_out(self, sizes: list[int]) -> None:
        self.shard_sizes = sizes
        self._starts = [0]
        for n in sizes:
            self._starts.append(self._starts[-1] + n)

    def _reset(self) -> None:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in self._held:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __len__(self) -> int:
        return self._starts[-1]

    def locate(self, index: int) -> tuple[int, int]:
        """(piece, sample within that piece) of global sample ``index``."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample {index} is outside 0..{len(self) - 1}")
        index %= len(self)
        piece = bisect_right(self._starts, index) - 1
        return piece, index - self._starts[piece]

    def _pieces_of(self, indices: Sequence[int]) -> list[int]:
        """The pieces that samples ``indices`` lie in, in order, each once per run of samples in it."""
        pieces: list[int] = []
        for index in indices:
            piece = bisect_right(self._starts, int(index)) - 1
            if not pieces or pieces[-1] != piece:
                pieces.append(piece)
        return pieces


class FileDataset(Pieces, Generic[T]):
    """Base of the in-place formats: a map-style dataset over ``spans`` (files with their sample counts).

    Subclasses call :meth:`_setup` from ``__init__`` and implement :meth:`_load` (sample ``local`` of file
    ``file``, decoded) and :meth:`describe`.

    Attributes:
        shard_sizes: samples per file, contiguous in index order (for ``ResumableLoader(shard_window=k)``).
        fingerprint: the data's identity in the saved position (listing and reading options).
    """

    kind = "files"
    _held = ("_handles",)

    def _setup(
        self,
        source: Source,
        spans: Sequence[FileSpan],
        *,
        augment: Callable[[T, int], T] | None,
        open_files: int,
        extra: str = "",
    ) -> None:
        if not (isinstance(open_files, int) and open_files >= 1):
            raise ConfigError(f"open_files must be an integer >= 1, got {open_files!r}")
        kept = [s for s in spans if s.samples > 0]  # a file too short for one sample holds none
        if not kept:
            raise DataError(f"{source.url} holds no {self.kind} samples: check the URL and the options")
        self._source = source
        self._spans = kept
        self.augment = augment
        self.open_files = open_files
        self._lay_out([s.samples for s in kept])
        self.fingerprint = listing_fingerprint(self.kind, spans, extra)
        self._reset()

    def _reset(self) -> None:
        """(Re)create what one process holds open; called after unpickling too."""
        self._handles: Handles[Any] = Handles(self.open_files)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._source.url!r}, samples={len(self)}, files={len(self._spans)})"

    def __getitem__(self, index: int) -> T:
        return self._load(*self.locate(index))

    @property
    def get_seeded(self) -> Callable[[int, int], T]:
        """``get_seeded(index, seed)``: the sample passed through ``augment`` with its per-sample seed.

        Present only when an ``augment`` was given, so that ``ResumableLoader`` hands seeds only then.
        """
        augment = self.augment
        if augment is None:
            raise AttributeError("get_seeded: this dataset was made without augment=")
        return lambda index, seed: augment(self[index], seed)

    def file_url(self, file: int) -> str:
        """The URL of file ``file`` (the base URL itself when the dataset is one file)."""
        name = self._spans[file].name
        return self._source.url if not name else join_url(self._source.url, name)

    def file_info(self, file: int) -> RemoteInfo:
        span = self._spans[file]
        return RemoteInfo(size=span.size, md5=span.md5)

    def file_samples(self, file: int) -> range:
        """The global indices of the samples in file ``file`` (for error messages)."""
        return range(self._starts[file], self._starts[file + 1])

    def prefetch(self, indices: Sequence[int]) -> None:
        """Download the files that ``indices`` (this rank's upcoming samples, in order) need, in that order."""
        if self._source.is_local or self._source.cache_config is None:
            return
        files = self._pieces_of(indices)
        self._source.prefetch([self.file_url(f) for f in files], [self.file_info(f) for f in files])

    def close(self) -> None:
        """Release the open files and stop prefetching."""
        self._handles.close()
        self._source.close()

    def buffer(self, file: int, stack: contextlib.ExitStack) -> Buffer | None:
        """File ``file``'s bytes for the life of ``stack`` (see :meth:`Source.buffer`; when the cache needs
        room, this process's idle open files go first), or None when it is remote without a cache."""
        url, info = self.file_url(file), self.file_info(file)
        return stack.enter_context(self._source.buffer(url, info, self._handles.close))

    def local_path(self, file: int, stack: contextlib.ExitStack) -> str | None:
        """A local path holding file ``file`` for the life of ``stack`` (through the cache, pinned), or None
        when the file is remote and there is no cache (then read it with ranged requests)."""
        if self._source.is_local:
            return self._source.local_path(self.file_url(file))
        cache = self._source.cache
        if cache is None:
            return None
        url, info = self.file_url(file), self.file_info(file)
        return str(stack.enter_context(cache.open(url, expected=info, release=self._handles.close)))

    def describe(self) -> dict[str, Any]:
        """What ``goodput data inspect`` prints: format, samples, files, and the format's own fields."""
        return {"format": self.kind, "samples": len(self), "shards": len(self._spans)}

    def _load(self, file: int, local: int) -> T:
        raise NotImplementedError
