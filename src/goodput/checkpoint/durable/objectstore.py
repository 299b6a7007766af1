"""Whole-object transfers with concurrent multipart parts, for DCP's fsspec writer and reader on object stores.

DCP's ``FsspecWriter`` writes each file through ``fs.open(path, "wb")``: s3fs then uploads one part at a time
as its buffer fills, so a rank's shard crosses the network over a single connection. ``ConcurrentObjectFileSystem``
wraps DCP's fsspec ``FileSystem``: on s3fs, a file opened for writing is a multipart upload whose parts go out
while DCP still writes the file, ``concurrency`` in flight (``_part_upload.PartUpload``); on other fsspec
backends it collects its bytes in memory and, when closed, is uploaded with ``fs.pipe_file(..., chunksize,
max_concurrency)``; ``read_object`` fetches a whole object with ``fs.cat_file(..., max_concurrency)``
(concurrent ranged GETs). Both are s3fs's own calls; other fsspec backends that do not take these arguments
fall back to their plain ``pipe_file``/``cat_file``.

``fetch_object`` is the restore's fetch: the same ranged GETs, ``concurrency`` in flight, each part copied into
one buffer and handed on in order (to the checksum) while the later parts are still on the wire. s3fs's
``cat_file`` gathers a batch of parts, copies them into a buffer, and then copies that buffer once more into
``bytes``; hashing after it would be a third pass over the bytes, none of them overlapped with the download.

The object is complete when the multipart upload is completed (when DCP's stream is left), before DCP writes
``.metadata`` and long before the manager writes the manifest (the commit marker).
"""

from __future__ import annotations

import contextlib
import io
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from goodput.checkpoint.durable._part_upload import PartUpload, streams_parts
from goodput.checkpoint.durable._wrapped_fs import WrappedFileSystem
from goodput.errors import CheckpointCorrupt

__all__ = ["ConcurrentObjectFileSystem", "fetch_object", "read_object"]

PART_BYTES = 16 << 20
CONCURRENCY = 8


def _call(fs: Any, method: str, *args: Any, chunksize: int, concurrency: int) -> Any:
    try:
        return getattr(fs, method)(*args, chunksize=chunksize, max_concurrency=concurrency)
    except TypeError:  # a backend without concurrent transfers
        return getattr(fs, method)(*args)


def read_object(fs: Any, path: str, *, chunksize: int = PART_BYTES, concurrency: int = CONCURRENCY) -> bytes:
    """The whole object at ``path``, fetched as ``concurrency`` ranged GETs at a time."""
    return bytes(_call(fs, "cat_file", path, chunksize=chunksize, concurrency=concurrency))


def fetch_object(
    fs: Any,
    path: str,
    *,
    size: int | None = None,
    consume: Callable[[memoryview], Any] | None = None,
    chunksize: int = PART_BYTES,
    concurrency: int = CONCURRENCY,
) -> bytearray:
    """The whole object at ``path`` (``size`` bytes; asked for when None), fetched as ranged GETs of
    ``chunksize`` bytes, ``concurrency`` in flight at any time (a new one starts as each arrives).

    Each part is copied into place as it arrives and, in order, passed to ``consume`` (e.g. a hasher's
    ``update``), so the check runs while later parts are downloading.

    Raises:
        CheckpointCorrupt: the object is shorter than ``size``.
    """
    total = int(fs.size(path)) if size is None else size
    buffer = bytearray(total)
    view = memoryview(buffer)
    parts = iter([(start, min(start + chunksize, total)) for start in range(0, total, chunksize)])
    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="goodput-get") as pool:
        in_flight: deque[tuple[int, int, Future[Any]]] = deque()

        def more() -> None:
            part = next(parts, None)
            if part is not None:
                in_flight.append((*part, pool.submit(fs.cat_file, path, start=part[0], end=part[1])))

        for _ in range(max(1, concurrency)):
            more()
        while in_flight:
            start, end, pending = in_flight.popleft()
            data = pending.result()
            more()
            if len(data) != end - start:
                raise CheckpointCorrupt(
                    f"{path}: bytes {start}-{end} are cut short ({len(data)} of {end - start})"
                )
            view[start:end] = data
            if consume is not None:
                consume(view[start:end])
    return buffer


class _UploadOnClose(io.BytesIO):
    """Collects a file's bytes; ``upload()`` sends them as one concurrent multipart upload."""

    def fileno(self) -> int:
        raise io.UnsupportedOperation("an object being uploaded has no file descriptor")


class ConcurrentObjectFileSystem(WrappedFileSystem):
    """DCP's fsspec ``FileSystem`` with concurrent multipart uploads for every file written through it.

    Args:
        inner: DCP's ``_fsspec_filesystem.FileSystem`` (its ``fs`` is the fsspec filesystem, e.g. s3fs).
        chunksize: bytes per part.
        concurrency: parts in flight at once.
    """

    def __init__(self, inner: Any, *, chunksize: int = PART_BYTES, concurrency: int = CONCURRENCY) -> None:
        super().__init__(inner)
        self.chunksize = chunksize
        self.concurrency = concurrency

    @contextlib.contextmanager
    def _stream(self, path: Any, mode: str) -> Iterator[Any]:
        if streams_parts(self._inner.fs):  # s3fs: parts go out while DCP is still writing the file
            upload = PartUpload(
                self._inner.fs, str(path), chunksize=self.chunksize, concurrency=self.concurrency
            )
            try:
                yield upload
                upload.finish()
            except BaseException:
                upload.abort()
                raise
            return
        buffer = _UploadOnClose()
        original_close = buffer.close
        buffer.close = lambda: None  # type: ignore[method-assign]  # DCP closes the stream before we upload
        try:
            yield buffer
            _call(
                self._inner.fs,
                "pipe_file",
                str(path),
                buffer.getvalue(),
                chunksize=self.chunksize,
                concurrency=self.concurrency,
            )
        finally:
            original_close()
