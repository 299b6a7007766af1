"""A file written to S3 as a multipart upload whose parts go out while the file is still being written.

DCP serialises a rank's whole shard into one stream. Collecting it in memory and uploading it when closed
(``pipe_file``) puts the whole serialisation before the first byte on the wire, and s3fs's ``pipe_file`` sends
its parts in batches of ``concurrency``, waiting for the slowest part of a batch before it starts the next one:
one slow part (a busy server) holds the other slots idle.

``PartUpload`` fills one part-sized buffer at a time; each full part is sent at once with s3fs's own
``upload_part`` call on s3fs's event loop, ``concurrency`` parts in flight at any time (the next one is sent as
soon as any one has arrived). The writer waits only when every slot is busy, so serialising overlaps the
upload and memory stays at ``concurrency + 1`` parts instead of the whole file. The buffers are reused from a
small pool for the process's later saves (fresh memory costs a page fault per 4 KiB on first touch).

The object exists only once ``finish`` completes the multipart upload, after every part arrived: a failed or
abandoned write (``abort``) leaves no object, as a failed ``pipe_file`` did. A file smaller than one part is
sent with one ``pipe_file`` call.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

__all__: list[str] = []

_POOL: list[bytearray] = []
_POOL_LOCK = threading.Lock()


def _take(size: int) -> bytearray:
    with _POOL_LOCK:
        while _POOL:
            buffer = _POOL.pop()
            if len(buffer) == size:
                return buffer
    return bytearray(size)


def _give(buffer: bytearray, keep: int) -> None:
    with _POOL_LOCK:
        if len(_POOL) < keep:
            _POOL.append(buffer)


def streams_parts(fs: Any) -> bool:
    """Whether ``fs`` is s3fs (its ``_call_s3`` coroutine and event loop), so parts can be sent as written."""
    return callable(getattr(fs, "_call_s3", None)) and getattr(fs, "loop", None) is not None


class PartUpload(io.RawIOBase):
    """A write-only stream that uploads ``path`` to s3fs's ``fs`` in parts of ``chunksize`` bytes,
    ``concurrency`` in flight. Call ``finish()`` after the last write (the object then exists) or ``abort()``.
    ``close()`` alone does nothing (DCP closes the stream before its writer is done with it)."""

    def __init__(self, fs: Any, path: str, *, chunksize: int, concurrency: int) -> None:
        super().__init__()
        self._fs = fs
        self._path = path
        self._bucket, self._key = fs.split_path(path)[:2]
        self._chunksize = chunksize
        self._concurrency = max(1, concurrency)
        self._buffer = _take(chunksize)
        self._fill = 0
        self._written = 0
        self._upload_id: str | None = None
        self._in_flight: dict[Future[Any], tuple[int, bytearray | None]] = {}
        self._etags: dict[int, str] = {}
        self._parts = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._written

    def fileno(self) -> int:
        raise io.UnsupportedOperation("an object being uploaded has no file descriptor")

    def close(self) -> None:
        pass  # finish() or abort() ends the upload

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        done, total = 0, len(view)
        while done < total:
            n = min(total - done, self._chunksize - self._fill)
            self._buffer[self._fill : self._fill + n] = view[done : done + n]
            self._fill += n
            done += n
            if self._fill == self._chunksize:
                self._send(self._buffer, pooled=True)
                self._buffer, self._fill = _take(self._chunksize), 0
        self._written += total
        return total

    def _call(self, method: str, **kwargs: Any) -> Future[Any]:
        coroutine = self._fs._call_s3(method, Bucket=self._bucket, Key=self._key, **kwargs)
        return asyncio.run_coroutine_threadsafe(coroutine, self._fs.loop)

    def _send(self, body: bytearray, *, pooled: bool) -> None:
        if self._upload_id is None:
            self._upload_id = str(self._call("create_multipart_upload").result()["UploadId"])
        while len(self._in_flight) >= self._concurrency:
            self._collect(wait(self._in_flight, return_when=FIRST_COMPLETED).done)
        self._parts += 1
        future = self._call("upload_part", PartNumber=self._parts, UploadId=self._upload_id, Body=body)
        self._in_flight[future] = (self._parts, body if pooled else None)

    def _collect(self, done: set[Future[Any]]) -> None:
        """Record the parts that arrived and pool their buffers; raises a part's error."""
        for future in done:
            number, buffer = self._in_flight.pop(future)
            if buffer is not None:
                _give(buffer, self._concurrency + 1)
            self._etags[number] = future.result()["ETag"]

    def finish(self) -> None:
        """Send what is left and complete the upload: the object exists, whole, when this returns."""
        if self._upload_id is None:  # smaller than one part: one PUT
            self._fs.pipe_file(self._path, bytes(self._buffer[: self._fill]))
            _give(self._buffer, self._concurrency + 1)
            return
        if self._fill:
            self._send(self._buffer[: self._fill], pooled=False)  # a copy of the last, short part
        _give(self._buffer, self._concurrency + 1)
        while self._in_flight:
            self._collect(wait(self._in_flight, return_when=FIRST_COMPLETED).done)
        parts = [{"PartNumber": n, "ETag": self._etags[n]} for n in sorted(self._etags)]
        self._call(
            "complete_multipart_upload", UploadId=self._upload_id, MultipartUpload={"Parts": parts}
        ).result()
        self._fs.invalidate_cache(self._path)

    def abort(self) -> None:
        """Stop the upload: wait for the parts in flight, then abort it (no object is created)."""
        if self._in_flight:
            wait(self._in_flight)
        self._in_flight.clear()
        if self._upload_id is not None:
            # best effort: an unfinished upload is invisible, and stores expire them
            with contextlib.suppress(Exception):
                self._call("abort_multipart_upload", UploadId=self._upload_id).result()
