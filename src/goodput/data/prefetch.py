"""DevicePrefetcher: the next batch is on its way (or already on the device) while the current one computes.

On CUDA, batch N+1 is copied to the GPU on a side stream (from pinned memory, ``non_blocking``) while batch N
computes; the compute stream waits for the copy before it touches the batch, and the batch's memory is recorded
on the compute stream so the caching allocator does not reuse it early. Elsewhere a background thread keeps the
next batch ready, so the loop's wait is only what loading could not hide.

Over a :class:`~goodput.data.loader.ResumableLoader` the prefetcher keeps the loader's exactly-once contract: a
batch counts as consumed only when the loop receives it from the prefetcher, and the loop's wait is recorded
in the loader's ``fetch_seconds``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from goodput.data.loader import FetchTimes, ResumableLoader
from goodput.errors import ConfigError

__all__ = ["DevicePrefetcher"]

_END = object()


class DevicePrefetcher:
    """Wrap an iterable of batches so that the next batch is prepared while the loop works on the current one.

    Args:
        source: a :class:`ResumableLoader` (its position and ``fetch_seconds`` stay exact) or any iterable of
            batches (tensors, or lists/tuples/dicts of them).
        device: where batches go: a ``torch.device`` or its name (None: ``cuda`` when available, else ``cpu``).
        depth: batches kept ready ahead on the CPU path.

    Attributes:
        fetch_seconds: the loop's wait per batch (the loader's own :class:`FetchTimes` over a loader).
    """

    def __init__(self, source: Iterable[Any], device: Any = None, *, depth: int = 1) -> None:
        import torch

        if isinstance(depth, bool) or not isinstance(depth, int) or depth <= 0:
            raise ConfigError(f"depth must be a positive integer, got {depth!r}")
        self.source = source
        self.device = torch.device(device if device is not None else _default_device())
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {self.device} requested but CUDA is not available")
        self.depth = depth
        self.fetch_seconds = source.fetch_seconds if isinstance(source, ResumableLoader) else FetchTimes()

    def __iter__(self) -> Iterator[Any]:
        pull: Callable[[], Any]
        deliver: Callable[[float], None]
        finish: Callable[[], None]
        if isinstance(self.source, ResumableLoader):
            iteration = self.source.begin()
            pull, deliver, finish = iteration.pull, iteration.deliver, iteration.finish
        else:
            batches = iter(self.source)

            def pull_next() -> Any:
                return next(batches)

            pull, deliver, finish = pull_next, self.fetch_seconds.record, _nothing
        if self.device.type == "cuda":
            return self._cuda(pull, deliver, finish)
        return self._threaded(pull, deliver, finish)

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    def _threaded(
        self, pull: Callable[[], Any], deliver: Callable[[float], None], finish: Callable[[], None]
    ) -> Iterator[Any]:
        ready: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        device = self.device
        worker = threading.Thread(
            target=_produce, args=(pull, device, ready, stop), name="goodput-prefetch", daemon=True
        )
        worker.start()
        try:
            while True:
                start = time.perf_counter()
                kind, value = ready.get()
                if kind == "end":
                    finish()
                    return
                if kind == "error":
                    raise value
                deliver(time.perf_counter() - start)
                yield value
        finally:
            stop.set()
            while worker.is_alive():  # unblock a pending put, then wait for the batch in flight to land
                try:
                    ready.get_nowait()
                except queue.Empty:
                    worker.join(timeout=0.05)

    def _cuda(
        self, pull: Callable[[], Any], deliver: Callable[[float], None], finish: Callable[[], None]
    ) -> Iterator[Any]:
        import torch

        copy_stream = torch.cuda.Stream(device=self.device)

        def load() -> Any:
            try:
                batch = pull()
            except StopIteration:
                return _END
            with torch.cuda.stream(copy_stream):
                return _to_device(batch, self.device, non_blocking=True)

        start = time.perf_counter()
        current = load()
        while current is not _END:
            compute_stream = torch.cuda.current_stream(self.device)
            compute_stream.wait_stream(copy_stream)  # the copy of `current` is done before compute uses it
            _record_stream(current, compute_stream)  # its memory is not reused while compute still reads it
            upcoming = load()  # issue the copy of the next batch; it overlaps the compute of `current`
            deliver(time.perf_counter() - start)
            yield current
            start = time.perf_counter()
            current = upcoming
        finish()


def _nothing() -> None:
    return None


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _produce(
    pull: Callable[[], Any], device: Any, ready: queue.Queue[tuple[str, Any]], stop: threading.Event
) -> None:
    """The CPU path's thread: pull batches, move them to ``device`` and queue them, until stopped or done."""
    while not stop.is_set():
        item: tuple[str, Any]
        try:
            item = ("batch", _to_device(pull(), device, non_blocking=False))
        except StopIteration:
            item = ("end", None)
        except BaseException as err:  # handed to the loop's thread, which raises it
            item = ("error", err)
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.05)
                break
            except queue.Full:
                continue
        if item[0] != "batch":
            return


def _map_tensors(obj: Any, fn: Callable[[Any], Any]) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)({k: _map_tensors(v, fn) for k, v in obj.items()})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_map_tensors(v, fn) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj


def _to_device(batch: Any, device: Any, *, non_blocking: bool) -> Any:
    def move(t: Any) -> Any:
        if t.device == device:
            return t
        if non_blocking and t.device.type == "cpu" and not t.is_pinned():
            t = t.pin_memory()  # an asynchronous copy needs page-locked memory
        return t.to(device, non_blocking=non_blocking)

    return _map_tensors(batch, move)


def _record_stream(batch: Any, stream: Any) -> None:
    def record(t: Any) -> Any:
        if t.is_cuda:
            t.record_stream(stream)
        return t

    _map_tensors(batch, record)
