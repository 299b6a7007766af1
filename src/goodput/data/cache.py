"""Remote files (any fsspec URL) read through a local cache folder with a byte budget.

A file is downloaded once per node and then read from local disk. Downloads land under ``tmp/`` and are
renamed into ``files/`` only after their size and checksum (the store's ETag/MD5, or one the caller knows)
verify, so a partial file is never served, even after a crash. A per-file lock (a POSIX record lock) makes every other
process on the node wait for the one download instead of starting its own; one SQLite index counts the budget
for all of them. Eviction is least-recently-used and skips files that a reader has open or that sit inside a
prefetch window. ``prefetch(urls)`` downloads the files in the order they will be needed, in the background.

Readers never wait on each other for room (no hold and wait). Every reader of the node pins the files it has
open, and there may be more of them than the budget holds (8 ranks x 4 workers x 4 open shards). A read that
finds no room (a) evicts unpinned files, then files pinned only by a prefetch window (a lease on a file nobody
reads yet: its reader downloads it again if needed), (b) lets go of what its own process holds and is not
using (``release``: the dataset's idle open shards), (c) waits at most ``wait_seconds`` for room, holding
nothing but its pin on the file it asks for (not the file's download lock: a reader blocked on that lock
still holds its open files), and then (d) reads the file uncached instead of waiting longer: ``view``
into memory, ``open`` into a private copy under ``uncached/`` removed after use. No read waits without bound
on anything another reader holds (the per-file download lock is held for one bounded download), so no set of
readers can deadlock, whatever their number; pinned bytes are files counted in the budget, so they never
exceed it; a reader holds at most its own open files in memory when it reads uncached.

Layout of the folder::

    index.sqlite      entries (ready / loading, size, owner), pins, node-wide counters
    files/<key>       complete, verified files (key = SHA-256 of the URL)
    tmp/<key>.<owner>.part   downloads in flight; removed when their owner is gone
    uncached/<key>.<owner>.<n>   private copies read when the budget has no room (outside it); likewise
    locks/<key>.lock  one download per file per node
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from goodput._client_random import isolate_store_clients
from goodput._storage_errors import redact_url, secret_values
from goodput.data._cacheconfig import CacheConfig
from goodput.data._cachefolder import FileLocks, clean_stale, mapped_file
from goodput.data._cacheindex import READY, CacheIndex, owner_token, part_name
from goodput.data._remote import (
    RemoteInfo,
    RetryPolicy,
    call_with_retries,
    download,
    fetch_verified,
    info_of,
)
from goodput.errors import DataError, StorageError

__all__ = ["CacheConfig", "RemoteCache"]

log = logging.getLogger(__name__)
# What a forked child inherited (SQLite connections, filesystems with event loops): kept alive, unused, so that
# their finalizers never run in the child (they would close the parent's sessions and WAL from here).
_INHERITED: list[object] = []

_USE = "use"
_WINDOW = "window"
METRIC_NAMES = (
    "hits",
    "misses",
    "bytes_downloaded",
    "download_seconds",
    "wait_seconds",
    "prefetch_lead_seconds",
    "evictions",
    "retries",
    "uncached_reads",
)


@dataclass
class _Counters:
    values: dict[str, float] = field(default_factory=lambda: dict.fromkeys(METRIC_NAMES, 0.0))
    leads: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **deltas: float) -> None:
        with self.lock:
            for name, value in deltas.items():
                self.values[name] += value


class RemoteCache:
    """Reads remote files through the local cache folder; safe across threads, processes and restarts.

    Args:
        config: the cache's settings.
        storage_options: passed to ``fsspec.filesystem`` (credentials, endpoint); never logged or shown.

    Picklable: the copy in another process reopens the index and the filesystems there and owns no prefetch.
    """

    def __init__(self, config: CacheConfig, *, storage_options: Mapping[str, Any] | None = None) -> None:
        self.config = config
        self._options = dict(storage_options or {})
        self._secrets = secret_values(self._options)
        self._setup()

    def _setup(self) -> None:
        for sub in ("files", "tmp", "locks", "uncached"):
            os.makedirs(os.path.join(self.config.folder, sub), exist_ok=True)
        self._pid = os.getpid()
        self._owner = owner_token()
        self._index = CacheIndex(os.path.join(self.config.folder, "index.sqlite"))
        self._fs: dict[str, Any] = {}
        self._fs_lock = threading.Lock()
        self._counters = _Counters()
        self._file_lock = FileLocks(os.path.join(self.config.folder, "locks"))
        self._prefetcher: Any = None
        self._uncached = 0  # names this process's private copies
        clean_stale(self.config.folder, self._index)

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config = state["config"]
        self._options = state["options"]
        self._secrets = secret_values(self._options)
        self._setup()

    def __repr__(self) -> str:
        return f"RemoteCache(folder={self.config.folder!r}, budget_bytes={self.config.budget_bytes})"

    # ---- public API --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def open(
        self, url: str, *, expected: RemoteInfo | None = None, release: Callable[[], None] | None = None
    ) -> Iterator[str]:
        """The local path of ``url``, downloaded if needed and kept from eviction inside the block.

        When the budget has no room because other readers hold it, the path is a private copy outside the
        budget, removed when the block ends (counted in ``uncached_reads``): a read never waits on other
        readers for longer than ``wait_seconds``.

        Args:
            url: fsspec URL of the remote file.
            expected: its size and MD5 when the caller knows them (saves a metadata request).
            release: called when the budget has no room, to let go of files this process holds and is not
                using (a dataset's idle open files), before waiting for others.

        Raises:
            StorageError: the store failed after every retry, or refused permanently.
            DataError: the file is larger than the whole budget.
        """
        with self._held(url, expected, release) as path:
            if path is not None:
                yield path
                return
            fs, remote = self._filesystem(url)
            info = expected if expected is not None else self._retried(lambda: info_of(fs, remote), url)
            self._uncached += 1
            name = f"{self.key(url)}.{self._owner.replace(':', '-')}.{self._uncached}"
            private = os.path.join(self.config.folder, "uncached", name)
            try:
                self._retried(lambda: self._download_once(fs, remote, private, info), url)
                self._count_uncached()
                yield private
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(private)

    @contextlib.contextmanager
    def view(
        self, url: str, *, expected: RemoteInfo | None = None, release: Callable[[], None] | None = None
    ) -> Iterator[bytes | mmap.mmap]:
        """The content of ``url`` as a read-only buffer, kept valid inside the block: a map of the cached file,
        or the bytes read straight from the store when the budget has no room (as :meth:`open`)."""
        with self._held(url, expected, release) as path:
            if path is None:
                yield self._read_uncached(url, expected)
                return
            with mapped_file(path) as data:
                yield data

    def read(self, url: str, *, expected: RemoteInfo | None = None) -> bytes:
        """The whole content of ``url``, read through the cache (uncached when it has no room, see ``open``)."""
        with self.view(url, expected=expected) as data:
            return data if isinstance(data, bytes) else data[:]

    @contextlib.contextmanager
    def _held(
        self, url: str, expected: RemoteInfo | None, release: Callable[[], None] | None
    ) -> Iterator[str | None]:
        """The cached file's path, pinned inside the block; None when the budget has no room for it."""
        key = self.key(url)
        self._check_fork()
        entry, lead = self._index.pin_and_hit(key, self._owner, time.time())
        try:
            path = self._local(key)
            if entry is not None and entry.state == READY and os.path.exists(path):
                self._counters.add(hits=1)
                self._record_lead(lead)
                yield path
                return
            started = time.monotonic()
            cached = self._ensure(url, key, expected, demand=True, release=release)
            waited = time.monotonic() - started
            self._counters.add(misses=1, wait_seconds=waited)
            self._index.mark_hit(key, time.time(), {"misses": 1, "wait_seconds": waited})
            yield path if cached else None
        finally:
            # At interpreter exit a frozen daemon thread (a prefetch download) may hold the index lock
            # forever; the pin dies with this process anyway (pins name their owner, checked for liveness).
            if not sys.is_finalizing():
                self._index.unpin(key, self._owner, _USE)

    def prefetch(self, urls: Sequence[str], *, expected: Sequence[RemoteInfo | None] | None = None) -> None:
        """Download ``urls`` in this order in the background, a bounded window ahead of the readers.

        Replaces any earlier prefetch plan of this process. Repeated URLs are fetched once, when first needed.
        """
        from goodput.data._prefetch import Prefetcher

        self._check_fork()
        if self._prefetcher is None:
            self._prefetcher = Prefetcher(self)
        infos = list(expected) if expected is not None else [None] * len(urls)
        seen: set[str] = set()
        plan = []
        for url, info in zip(urls, infos, strict=True):
            if url not in seen:
                seen.add(url)
                plan.append((url, info))
        self._prefetcher.start(plan)

    def metrics(self) -> dict[str, float]:
        """This process's counters: hits, misses, bytes and seconds downloaded, read waits, mean prefetch
        lead (seconds a prefetched file was ready before its first use), evictions, retries."""
        with self._counters.lock:
            return dict(self._counters.values)

    def node_metrics(self) -> dict[str, float]:
        """The same counters summed over every process that used this cache folder."""
        values = dict.fromkeys(METRIC_NAMES, 0.0)
        values.update({k: v for k, v in self._index.counters().items() if k in values})
        return values

    def usage_bytes(self) -> int:
        """Bytes counted against the budget now (ready files and downloads in flight), node-wide."""
        return self._index.usage()

    def close(self) -> None:
        """Stop prefetching and wait for the downloads in flight."""
        if self._prefetcher is not None and self._pid == os.getpid():
            self._prefetcher.stop()
            self._prefetcher = None

    @staticmethod
    def key(url: str) -> str:
        """The name of ``url``'s file in the cache folder."""
        return hashlib.sha256(url.encode()).hexdigest()[:40]

    # ---- used by the prefetcher --------------------------------------------------------------------
    def _pin_window(self, url: str) -> None:
        self._index.pin_and_get(self.key(url), self._owner, _WINDOW)

    def _unpin_window(self, url: str) -> None:
        self._index.unpin(self.key(url), self._owner, _WINDOW)

    def _remote_info(self, url: str, cancelled: Any = None) -> RemoteInfo | None:
        """Size and checksum of ``url`` from the store; None (logged) when it cannot be had."""
        fs, path = self._filesystem(url)
        try:
            return self._retried(lambda: info_of(fs, path), url, cancelled)
        except StorageError as err:
            log.warning("prefetch skips a file: %s", err)
            return None

    def _retried(self, fn: Any, url: str, cancelled: Any = None) -> Any:
        policy = RetryPolicy(
            self.config.attempts, self.config.backoff_seconds, self.config.max_backoff_seconds
        )
        return call_with_retries(
            fn, url=url, policy=policy, secrets=self._secrets, on_retry=self._on_retry, cancelled=cancelled
        )

    def _is_ready(self, key: str) -> bool:
        entry = self._index.entry(key)
        return entry is not None and entry.state == READY and os.path.exists(self._local(key))

    # ---- internals ---------------------------------------------------------------------------------
    def _check_fork(self) -> None:
        if self._pid != os.getpid():  # a forked DataLoader worker: own index handle, fs, no prefetcher
            _INHERITED.extend([self._index, self._fs, self._prefetcher])
            self._setup()

    def _local(self, key: str) -> str:
        return os.path.join(self.config.folder, "files", key)

    def _filesystem(self, url: str) -> tuple[Any, str]:
        import fsspec
        from fsspec.utils import get_protocol

        protocol = get_protocol(url)
        with self._fs_lock:
            fs = self._fs.get(protocol)
            if fs is None:
                isolate_store_clients(url)
                fs = fsspec.filesystem(protocol, skip_instance_cache=True, **self._options)
                self._fs[protocol] = fs
        return fs, fs._strip_protocol(url)

    def _ensure(
        self,
        url: str,
        key: str,
        expected: RemoteInfo | None,
        *,
        demand: bool,
        cancelled: Any = None,
        release: Callable[[], None] | None = None,
    ) -> bool:
        """Make ``key`` ready, downloading it unless another process is doing so (then wait for it).

        Returns False when the budget has no room: a prefetch skips the file, a read goes uncached. A read
        waits for room (steps (b)-(c) of the module docstring) *outside* the file's download lock: a reader
        blocked on that lock keeps its own open files pinned, so waiting inside it would make every other
        reader of the file hold its files while it waits for the room they take (hold and wait, until
        ``wait_seconds``), instead of reaching its own wait, where it lets go of them first.
        """
        fs, path = self._filesystem(url)
        info = expected
        deadline = time.monotonic() + self.config.wait_seconds
        delay = 0.01
        while True:
            with self._file_lock(key):
                if self._is_ready(key):
                    return True
                if info is None:
                    info = self._retried(lambda: info_of(fs, path), url, cancelled)
                pinned = self._reserve(key, info.size, url, demand=demand)
                if pinned is None:
                    self._download(fs, path, key, info, url, cancelled)
                    return True
            if not demand:
                return False
            if release is not None:
                release()  # this process's idle files first: then it holds nothing while it waits
                release = None
                continue
            if time.monotonic() > deadline:
                log.info("no room in the cache for %s (%d bytes in use): reading it uncached", key, pinned)
                return False
            time.sleep(delay)  # a bounded wait for other readers to close files (see the module docstring)
            delay = min(delay * 2, 0.2)

    def _download(self, fs: Any, path: str, key: str, info: RemoteInfo, url: str, cancelled: Any) -> None:
        """Download ``key`` into place, its bytes reserved; holding the file's lock."""
        started = time.monotonic()
        tmp_dir = os.path.join(self.config.folder, "tmp")
        for name in os.listdir(tmp_dir):  # holding the file's lock: any partial of it is a dead one's
            if name.startswith(key + "."):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(tmp_dir, name))
        tmp = os.path.join(tmp_dir, part_name(key, self._owner))
        try:
            self._retried(lambda: self._download_once(fs, path, tmp, info), url, cancelled)
            os.replace(tmp, self._local(key))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            self._index.abort(key)
            raise
        seconds = time.monotonic() - started
        self._counters.add(bytes_downloaded=info.size, download_seconds=seconds)
        self._index.commit(key, info.size, {"bytes_downloaded": info.size, "download_seconds": seconds})

    def _download_once(self, fs: Any, path: str, tmp: str, info: RemoteInfo) -> None:
        download(
            fs, path, tmp, info, chunk_bytes=self.config.chunk_bytes, range_workers=self.config.range_workers
        )

    def _reserve(self, key: str, size: int, url: str, *, demand: bool) -> int | None:
        """Count ``size`` bytes for ``key``, evicting as step (a) of the module docstring says (a read may
        evict files pinned only by prefetch windows); None when reserved, else the bytes of files in use."""
        if size > self.config.budget_bytes:
            raise DataError(
                f"{redact_url(url)} has {size} bytes, more than the cache budget "
                f"({self.config.budget_bytes}): raise CacheConfig.budget_bytes"
            )
        ok, evicted, pinned = self._index.reserve(
            key, size, self._owner, self.config.budget_bytes, self._evict_file, break_windows=demand
        )
        if not ok:
            return pinned
        self._counters.add(evictions=evicted)
        return None

    def _read_uncached(self, url: str, expected: RemoteInfo | None) -> bytes:
        fs, path = self._filesystem(url)
        info = expected if expected is not None else self._retried(lambda: info_of(fs, path), url)
        data: bytes = self._retried(lambda: fetch_verified(fs, path, info), url)
        self._count_uncached()
        return data

    def _count_uncached(self) -> None:
        self._counters.add(uncached_reads=1)
        self._index.bump({"uncached_reads": 1})

    def _evict_file(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._local(key))

    def _on_retry(self, err: BaseException) -> None:
        self._counters.add(retries=1)
        self._index.bump({"retries": 1})
        log.info("retrying a remote read after %s", type(err).__name__)

    def _record_lead(self, lead: float | None) -> None:
        if lead is None:
            return
        with self._counters.lock:
            n = self._counters.leads
            mean = self._counters.values["prefetch_lead_seconds"]
            self._counters.values["prefetch_lead_seconds"] = (mean * n + lead) / (n + 1)
            self._counters.leads = n + 1
