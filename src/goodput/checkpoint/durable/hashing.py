"""Checksums computed while DCP writes and reads, so that neither a save nor a restore reads the bytes twice.

DCP's storage writers and readers open every file through ``self.fs.create_stream(path, mode)``. Wrapping that
one seam covers both the local ``FileSystemWriter`` and the ``FsspecWriter`` (S3), and every file DCP writes
(``__<rank>_<n>.distcp`` shards and ``.metadata``, written as ``.metadata.tmp`` and renamed):

- ``HashingFileSystem`` hashes every byte as it goes into a file; DCP writes each file sequentially (no seeks),
  so the hash of the writes is the hash of the file. The save's manifest records it: no read-back.
- ``VerifyingFileSystem`` reads each file once (an ``mmap`` for local files, one concurrent GET for objects),
  checks its checksum when the manifest names one, and serves DCP's reads of that file from those bytes (also as
  ``stream.view``, for ``DirectReadMixin``); a mismatch raises ``CheckpointCorrupt`` naming the file before any
  of its bytes reach the training state.

Each rank's shard file is read whole and checked by one rank (rank ``r``'s files by rank ``r % world``, so by
their writer when the world size is unchanged). A rank that needs only a small part of another rank's file (DCP
puts each replicated item, e.g. the optimizer's ``param_groups`` and step counts, in one rank's file only) reads
just those bytes (ranged GETs on an object store): fetching the whole file for them would download every
such file once more, by each rank that needs a part of it. Those bytes reach the state
only after every rank has said its own checks passed (``DirectReadMixin``), so a corrupt file still stops the
restore on every rank before any of its bytes are used.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from goodput._buffer import BufferFile
from goodput.checkpoint.durable._wrapped_fs import WrappedFileSystem
from goodput.checkpoint.durable.manifest import FileEntry, check_digest, new_hasher
from goodput.checkpoint.durable.objectstore import fetch_object
from goodput.errors import CheckpointCorrupt

__all__ = ["HashingFileSystem", "VerifyingFileSystem"]

_RANK_FILE = re.compile(r"__(\d+)_")
PART_SHARE = 4  # a rank needing at most 1/PART_SHARE of a file it does not check reads only those bytes
SPAN_GAP = 64 << 10  # needed spans closer than this are fetched as one range


def _name(path: Any) -> str:
    """The file name a manifest records for ``path`` (DCP writes ``.metadata`` as ``.metadata.tmp``)."""
    return str(path).rstrip("/").rsplit("/", 1)[-1].rsplit(os.sep, 1)[-1].removesuffix(".tmp")


class _HashingWriter(io.RawIOBase):
    """Passes writes through to ``raw`` and hashes them on the way."""

    def __init__(self, raw: Any, algorithm: str) -> None:
        super().__init__()
        self.raw = raw
        self.hasher = new_hasher(algorithm)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self.hasher.update(view)
        written = self.raw.write(view)
        return len(view) if written is None else int(written)

    def tell(self) -> int:
        return int(self.raw.tell())

    def fileno(self) -> int:
        return int(self.raw.fileno())

    def flush(self) -> None:
        if not getattr(self.raw, "closed", False):
            self.raw.flush()

    def close(self) -> None:
        if self.closed:
            return
        super().close()  # flushes through to raw
        self.raw.close()


class HashingFileSystem(WrappedFileSystem):
    """A DCP ``FileSystem`` that records ``"<algorithm>:<hex>"`` of every file written through it."""

    def __init__(self, inner: Any, algorithm: str) -> None:
        super().__init__(inner)
        self.algorithm = algorithm
        self.digests: dict[str, str] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _stream(self, path: Any, mode: str) -> Iterator[Any]:
        with self._inner.create_stream(path, mode) as stream:
            writer = _HashingWriter(stream, self.algorithm)
            yield writer
        with self._lock:
            self.digests[_name(path)] = f"{self.algorithm}:{writer.hasher.hexdigest()}"


class VerifyingFileSystem(WrappedFileSystem):
    """A DCP ``FileSystem`` whose reads of the files in ``expected`` are checked against their checksums.

    ``create_stream`` reads a file whole, checked or not: mapped when local, fetched with concurrent ranged GETs
    from an object store (``local=False``). ``read_spans`` reads only some byte ranges of a file, unchecked, for a
    rank that another rank's check covers (see ``reads_whole``).

    Attributes:
        read_seconds: time spent reading and hashing files (the restore's ``read`` part).
        read_bytes: bytes read through it.
        rank, world_size, group: this rank among the ranks restoring together (``group``: their process group,
            None for the default one), for who checks which file.
    """

    handles = "r"

    def __init__(
        self,
        inner: Any,
        expected: Mapping[str, FileEntry],
        *,
        local: bool,
        rank: int = 0,
        world_size: int = 1,
        group: Any = None,
    ) -> None:
        super().__init__(inner)
        self._expected = dict(expected)
        self._local = local
        self.rank, self.world_size, self.group = rank, world_size, group
        self.read_seconds = 0.0
        self.read_bytes = 0
        self._lock = threading.Lock()

    @property
    def checks(self) -> bool:
        """Whether any file is checked (the manifest names checksums)."""
        return bool(self._expected)

    def checked_by(self, name: str) -> int | None:
        """The rank that reads file ``name`` whole and checks it; None: whichever rank reads it checks it."""
        match = _RANK_FILE.match(name)
        if match is None or name not in self._expected:
            return None
        return int(match.group(1)) % max(1, self.world_size)

    def reads_whole(self, name: str, needed: int, size: int) -> bool:
        """Whether this rank reads file ``name`` (``size`` bytes) whole, rather than only the ``needed`` bytes:
        whole when it needs much of it, or when no other rank's check covers it."""
        if needed * PART_SHARE > size:
            return True
        if name not in self._expected:
            return False  # nothing to check: read only what is needed
        owner = self.checked_by(name)
        return owner is None or owner == self.rank

    def unread_to_check(self, names_read: set[str]) -> list[str]:
        """The files this rank checks although it needs none of their bytes (after a change of world size), so
        that every file a rank reads in part is checked whole by another."""
        return sorted(n for n in self._expected if n not in names_read and self.checked_by(n) == self.rank)

    def read_spans(
        self, path: Any, spans: list[tuple[int, int]], stack: contextlib.ExitStack
    ) -> list[tuple[int, Any]]:
        """The bytes of the ``(offset, length)`` spans of a file, unchecked, as ``(start, buffer)`` ranges that
        cover them (nearby spans merged; a local file is mapped whole, which reads only the pages touched)."""
        start = time.perf_counter()
        if self._local:
            ranges: list[tuple[int, Any]] = [(0, self._map(str(path), stack))]
            got = sum(length for _, length in spans)
        else:
            merged: list[list[int]] = []
            for offset, length in sorted(spans):
                if merged and offset <= merged[-1][1] + SPAN_GAP:
                    merged[-1][1] = max(merged[-1][1], offset + length)
                else:
                    merged.append([offset, offset + length])
            fs = self._inner.fs
            starts, ends = [a for a, _ in merged], [b for _, b in merged]
            blobs = fs.cat_ranges([str(path)] * len(merged), starts, ends, on_error="raise")
            for a, b, blob in zip(starts, ends, blobs, strict=True):
                if len(blob) != b - a:
                    raise CheckpointCorrupt(f"{path}: bytes {a}-{b} are cut short ({len(blob)} of {b - a})")
            ranges = list(zip(starts, blobs, strict=True))
            got = sum(len(blob) for _, blob in ranges)
        with self._lock:
            self.read_seconds += time.perf_counter() - start
            self.read_bytes += got
        return ranges

    @contextlib.contextmanager
    def _stream(self, path: Any, mode: str) -> Iterator[Any]:
        entry = self._expected.get(_name(path))
        expected = entry.expected() if entry is not None else None
        start = time.perf_counter()
        with contextlib.ExitStack() as stack:
            hasher = new_hasher(expected[0]) if expected is not None else None
            if self._local:
                buffer: Any = self._map(str(path), stack)
                if hasher is not None:
                    hasher.update(buffer)
            else:  # one whole-object fetch (concurrent ranged GETs), hashed while later parts still download
                buffer = fetch_object(
                    self._inner.fs,
                    str(path),
                    size=entry.size if entry is not None else None,
                    consume=hasher.update if hasher is not None else None,
                )
            if hasher is not None and expected is not None:
                check_digest(str(path), expected, hasher.hexdigest())
            with self._lock:
                self.read_seconds += time.perf_counter() - start
                self.read_bytes += len(buffer)
            reader = stack.enter_context(BufferFile(buffer))
            yield reader

    @staticmethod
    def _map(path: str, stack: contextlib.ExitStack) -> Any:
        """The file's bytes, mapped (page-cache pages, no copy; a fresh buffer would cost a page fault per
        page, measured at ~10x a read from the page cache on the benchmark machine)."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return b""
            try:
                mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as err:
                raise CheckpointCorrupt(f"{path}: cannot be mapped for reading ({err})") from None
        stack.callback(_close_map, mapped)
        return mapped


def _close_map(mapped: mmap.mmap) -> None:
    """Unmap now, or, while a view of it is still alive (an error unwinding with it), when the last one goes."""
    with contextlib.suppress(BufferError):
        mapped.close()
