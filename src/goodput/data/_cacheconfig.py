"""How the local cache behaves: one keyword-only dataclass, validated when made (see ``cache.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from goodput.errors import ConfigError

DEFAULT_PREFETCH_BYTES = 256 << 20


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """How the local cache behaves.

    Args:
        folder: local directory of the cache (created; shared by every process on the node).
        budget_bytes: most bytes of cached files kept on disk, in-flight downloads included.
        prefetch_bytes: most bytes downloaded ahead of the readers by ``prefetch`` (the default 256 MiB is
            clamped to ``budget_bytes`` when the budget is smaller; a larger explicit value is an error).
        prefetch_workers: downloads in flight at once during prefetch.
        chunk_bytes: objects larger than this are fetched as range requests of this size.
        range_workers: range requests in flight at once for one large object (1: sequential).
        attempts: tries per request before giving up with a ``StorageError``.
        backoff_seconds: first backoff delay; doubles each retry, with full jitter.
        max_backoff_seconds: the largest backoff delay.
        wait_seconds: how long a read waits for budget space held by files other readers have open, before
            it reads the file uncached (``view``, ``read``) or gives up (``open``).
    """

    folder: str
    budget_bytes: int
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES
    prefetch_workers: int = 4
    chunk_bytes: int = 16 << 20
    range_workers: int = 4
    attempts: int = 6
    backoff_seconds: float = 0.2
    max_backoff_seconds: float = 5.0
    wait_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not self.folder or "://" in self.folder:
            raise ConfigError(f"CacheConfig.folder must be a local directory, got {self.folder!r}")
        positive = ("budget_bytes", "chunk_bytes", "prefetch_workers", "range_workers", "attempts")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"CacheConfig.{name} must be at least 1, got {getattr(self, name)!r}")
        for name in ("prefetch_bytes", "backoff_seconds", "max_backoff_seconds", "wait_seconds"):
            if getattr(self, name) < 0:
                raise ConfigError(f"CacheConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.prefetch_bytes == DEFAULT_PREFETCH_BYTES and self.budget_bytes < DEFAULT_PREFETCH_BYTES:
            object.__setattr__(self, "prefetch_bytes", self.budget_bytes)  # a small cache, a smaller window
        if self.prefetch_bytes > self.budget_bytes:
            raise ConfigError(
                f"CacheConfig.prefetch_bytes ({self.prefetch_bytes}) must not exceed budget_bytes "
                f"({self.budget_bytes}): the prefetch window has to fit in the cache"
            )
