"""A folder of files, one sample per file, at any fsspec URL, read through a local cache and decoded by the user.

The common layout on volumes and buckets (one image, one document, one ``.pt`` per sample). The listing is
taken once, when the dataset is made, and travels with it to DataLoader workers: workers never list again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from goodput._storage_errors import secret_values
from goodput.data._remote import RemoteInfo, call_with_retries, md5_from_details
from goodput.data._source import DEFAULT_RETRY, OnSource, Source, join_url
from goodput.data.cache import CacheConfig
from goodput.errors import DataError

__all__ = ["FolderDataset"]

T = TypeVar("T")


class FolderDataset(OnSource, Generic[T]):
    """Map-style dataset: sample ``i`` is the ``i``-th file under ``url`` (sorted by path), decoded.

    Args:
        url: fsspec URL of the folder (searched recursively).
        decode: turns one file's bytes into a sample (module-level, to pickle for DataLoader workers).
        cache: the local cache's settings; None reads every file straight from the store.
        suffixes: keep only files whose names end with one of these (e.g. ``(".jpg", ".png")``).
        storage_options: passed to fsspec (credentials; never logged or shown).

    Raises:
        DataError: when the folder holds no matching file.
    """

    def __init__(
        self,
        url: str,
        *,
        decode: Callable[[bytes], T],
        cache: CacheConfig | None = None,
        suffixes: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._source = Source(url, cache=cache, storage_options=storage_options)
        self.decode = decode
        self._files = self._list(url, tuple(suffixes) if suffixes else None, storage_options or {})
        if not self._files:
            raise DataError(f"{url} holds no files{' ending in ' + ', '.join(suffixes) if suffixes else ''}")
        listing = "\n".join(f"{name}\t{info.size}" for name, info in self._files)
        self.fingerprint = hashlib.sha256(listing.encode()).hexdigest()[:16]

    def _list(
        self, url: str, suffixes: tuple[str, ...] | None, options: Mapping[str, Any]
    ) -> list[tuple[str, RemoteInfo]]:
        fs = self._source.fs
        root = str(fs._strip_protocol(url)).rstrip("/")
        found: dict[str, dict[str, Any]] = call_with_retries(
            lambda: fs.find(root, detail=True),
            url=url,
            policy=DEFAULT_RETRY,
            secrets=secret_values(options),
        )
        files = []
        for path, details in sorted(found.items()):
            if details.get("type", "file") != "file":
                continue
            name = path[len(root) :].lstrip("/")
            if suffixes is None or name.endswith(suffixes):
                files.append((name, RemoteInfo(size=int(details["size"]), md5=md5_from_details(details))))
        return files

    def __repr__(self) -> str:
        return f"FolderDataset({self._source.url!r}, files={len(self)})"

    def __len__(self) -> int:
        return len(self._files)

    def __getitem__(self, index: int) -> T:
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample {index} is outside 0..{len(self) - 1}")
        name, info = self._files[index]
        url = join_url(self._source.url, name)
        cache = self._source.cache
        data = self._source.direct(url) if cache is None else cache.read(url, expected=info)
        return self.decode(data)

    def file_url(self, index: int) -> str:
        """The URL of sample ``index``'s file."""
        return join_url(self._source.url, self._files[index][0])

    def prefetch(self, indices: Sequence[int]) -> None:
        """Download the files of ``indices`` (this rank's upcoming samples, in order) in that order."""
        chosen = [self._files[int(i)] for i in indices]
        self._source.prefetch(
            [join_url(self._source.url, n) for n, _ in chosen], [info for _, info in chosen]
        )

    def close(self) -> None:
        """Stop prefetching."""
        self._source.close()
