"""Where a dataset's bytes come from: through a RemoteCache, or straight from the store (no cache).

Shared by the sharded and folder datasets. Holds no open handle across pickling: each process (DataLoader
worker, rank) reopens its filesystem and cache lazily, on first use.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from goodput._client_random import isolate_store_clients
from goodput._storage_errors import secret_values
from goodput.data._cachefolder import mapped_file
from goodput.data._remote import RemoteInfo, RetryPolicy, call_with_retries
from goodput.data.cache import CacheConfig, RemoteCache

Buffer = bytes | mmap.mmap
DEFAULT_RETRY = RetryPolicy(attempts=6, backoff_s=0.2, max_backoff_s=5.0)


# Objects a forked child inherited from its parent (filesystems with event loops, SQLite connections). Letting
# them be garbage-collected in the child would run their finalizers there (closing the parent's sessions on a
# loop whose thread does not exist in the child, which hangs; checkpointing the parent's SQLite WAL). They are
# kept alive, unused, instead.
_INHERITED: list[object] = []


def keep_inherited(*objects: object) -> None:
    """Keep objects inherited through ``fork`` alive for the life of this process (see ``_INHERITED``)."""
    _INHERITED.extend(o for o in objects if o is not None)


class OnSource:
    """A dataset that reads through one :class:`Source`, ``self._source``."""

    _source: Source

    def cache_metrics(self) -> dict[str, float]:
        """The cache's counters summed over every process on this node that reads through its folder
        (DataLoader workers included): hits, misses, bytes_downloaded, download_seconds, wait_seconds,
        prefetch_lead_seconds, evictions, retries, uncached_reads. Empty when the dataset has no cache."""
        return self._source.cache_metrics()

    def cache_usage(self) -> dict[str, Any]:
        """Where the cache is and how full: ``folder`` (absolute), ``budget_bytes`` and ``usage_bytes`` (counted
        against the budget now, node-wide). Empty when the dataset has no cache."""
        return self._source.cache_usage()


def join_url(base: str, name: str) -> str:
    """``base/name`` for a URL or a local path (never ``os.path.join``, which breaks ``s3://``)."""
    return base.rstrip("/") + "/" + name


class Source:
    """Reads objects under one base URL, through a cache when one is configured."""

    def __init__(
        self, url: str, *, cache: CacheConfig | None, storage_options: Mapping[str, Any] | None
    ) -> None:
        from fsspec.utils import get_protocol

        self.url = url
        self._local = get_protocol(url) in ("file", "local")
        self.cache_config = cache
        self._options = dict(storage_options or {})
        self._pid = -1
        self._fs: Any = None
        self._cache: RemoteCache | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "cache_config": self.cache_config, "options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], cache=state["cache_config"], storage_options=state["options"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"Source({self.url!r}, cache={self.cache_config!r})"

    def _refresh(self) -> None:
        if self._pid != os.getpid():
            if self._pid != -1:
                keep_inherited(self._fs, self._cache)
            import fsspec
            from fsspec.utils import get_protocol

            isolate_store_clients(self.url)
            self._fs = fsspec.filesystem(get_protocol(self.url), skip_instance_cache=True, **self._options)
            self._cache = (
                None
                if self.cache_config is None
                else RemoteCache(self.cache_config, storage_options=self._options)
            )
            self._pid = os.getpid()

    @property
    def fs(self) -> Any:
        self._refresh()
        return self._fs

    @property
    def cache(self) -> RemoteCache | None:
        self._refresh()
        return self._cache

    @property
    def options(self) -> dict[str, Any]:
        """The storage options (credentials among them: never log or show them)."""
        return self._options

    @property
    def is_local(self) -> bool:
        """Whether the base URL is on a local disk (then there is nothing to cache)."""
        return self._local

    def local_path(self, url: str) -> str:
        return str(self.fs._strip_protocol(url))

    def direct(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes [start, end) of ``url`` straight from the store (no cache), with retries."""
        config = self.cache_config
        policy = (
            DEFAULT_RETRY
            if config is None
            else RetryPolicy(config.attempts, config.backoff_seconds, config.max_backoff_seconds)
        )
        path = self.fs._strip_protocol(url)
        data: bytes = call_with_retries(
            lambda: self.fs.cat_file(path, start=start, end=end),
            url=url,
            policy=policy,
            secrets=secret_values(self._options),
        )
        return data

    @contextlib.contextmanager
    def buffer(
        self, url: str, info: RemoteInfo, release: Callable[[], None] | None = None
    ) -> Iterator[Buffer | None]:
        """The whole file at ``url`` inside the block: mapped when local, through the cache when there is one
        (pinned, or read uncached when other readers hold the budget; ``release`` lets go of this process's
        idle files first, see :meth:`RemoteCache.view`), or None when it is remote without a cache (read it
        by ranges with :meth:`direct`)."""
        cache = self.cache
        if cache is not None:
            with cache.view(url, expected=info, release=release) as data:
                yield data
        elif self._local:
            with mapped_file(self.local_path(url)) as data:
                yield data
        else:
            yield None

    def prefetch(self, urls: Sequence[str], expected: Sequence[RemoteInfo | None]) -> None:
        cache = self.cache
        if cache is not None:
            cache.prefetch(urls, expected=expected)

    def cache_metrics(self) -> dict[str, float]:
        """Node-wide cache counters (every process reading through the cache folder); empty without a cache."""
        cache = self.cache
        return {} if cache is None else cache.node_metrics()

    def cache_usage(self) -> dict[str, Any]:
        """The cache's folder, budget and node-wide usage now (see ``OnSource.cache_usage``); empty without one."""
        cache = self.cache
        if cache is None:
            return {}
        config = cache.config
        return {
            "folder": os.path.abspath(config.folder),
            "budget_bytes": config.budget_bytes,
            "usage_bytes": cache.usage_bytes(),
        }

    def close(self) -> None:
        if self._cache is not None and self._pid == os.getpid():
            self._cache.close()
