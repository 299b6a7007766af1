"""WebDataset tar shards read in place, by random access: exactly-once resume without converting the data.

A shard is a tar file; consecutive members named ``key.ext`` with the same ``key`` form one sample, as
WebDataset groups them (the key is the member's path up to the first dot of its file name, the extension the
rest, lower-cased; top-level ``__name__`` members are metadata and skipped). Each shard's index (every
sample's key and its members' offsets and sizes) is built once, from the tar headers, when the dataset is made,
and kept in the cache folder beside the cached shards (``wds-index/``), so later datasets and DataLoader
workers read a sample with one slice of the shard (or one ranged request without a cache), never by scanning.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from goodput._buffer import BufferFile
from goodput.data._files import FileDataset, FileSpan, list_files
from goodput.data._remote import RemoteInfo
from goodput.data._source import Buffer, Source
from goodput.data._tarscan import regular_members
from goodput.data.cache import CacheConfig
from goodput.errors import ConfigError, DataError

__all__ = ["WebDataset"]

T = TypeVar("T")
Members = list[tuple[str, int, int]]  # (extension, data offset, size) in tar order
_KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # WebDataset's split: key up to the first dot of the name
_META = re.compile(r"^__[^/]*__$")
_BRACES = re.compile(r"\{([^{}]*)\}")
_INDEX_VERSION = 1


def _identity(sample: dict[str, Any]) -> Any:
    return sample


def expand_urls(urls: str | Sequence[str]) -> list[str]:
    """Shard URLs from a list and brace patterns: ``shard-{000000..000009}.tar``, ``{train,val}.tar``."""
    found: list[str] = []
    for pattern in [urls] if isinstance(urls, str) else list(urls):
        match = _BRACES.search(pattern)
        if match is None:
            found.append(pattern)
            continue
        body, head, tail = match.group(1), pattern[: match.start()], pattern[match.end() :]
        span = re.fullmatch(r"(\d+)\.\.(\d+)", body)
        if span is not None:
            first, last = span.group(1), span.group(2)
            width = len(first) if first.startswith("0") else 0
            choices = [f"{n:0{width}d}" for n in range(int(first), int(last) + 1)]
        else:
            choices = body.split(",")
        found += expand_urls([head + choice + tail for choice in choices])
    return found


class WebDataset(FileDataset[T]):
    """Map-style dataset over WebDataset tar shards at any fsspec URL: sample ``i`` is a dict ext -> bytes
    (plus ``__key__`` and ``__url__``), passed through ``decode``.

    Args:
        urls: a folder of ``.tar`` shards, or shard URLs and brace patterns (``s3://b/shard-{0000..0099}.tar``).
        extensions: the extensions every sample must have (and the only ones returned); None: all.
        decode: turns the sample dict into what ``__getitem__`` returns (module-level, to pickle for workers).
        augment: ``augment(sample, seed)`` with the sample's per-sample seed; makes ``get_seeded`` exist.
        cache: the local cache for remote shards (whole shards, and their indexes); None reads samples of
            remote shards by ranged requests (the indexes are then built at every construction).
        storage_options: passed to fsspec (credentials; never logged or shown).
        open_files: shards each process keeps open (pinned in the cache).

    Raises:
        DataError: a shard is not a tar, is truncated (naming the sample cut off), has a member without an
            extension or twice the same one in a sample, or a sample lacks one of ``extensions``.
    """

    kind = "webdataset"

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        extensions: Sequence[str] | None = None,
        decode: Callable[[dict[str, Any]], T] = _identity,
        augment: Callable[[T, int], T] | None = None,
        cache: CacheConfig | None = None,
        storage_options: Mapping[str, Any] | None = None,
        open_files: int = 4,
    ) -> None:
        if isinstance(extensions, str):
            raise ConfigError(f"extensions must be a list of extensions, got the string {extensions!r}")
        self.extensions = None if extensions is None else tuple(e.lower().lstrip(".") for e in extensions)
        self.decode = decode
        base, listing = _listing(urls, cache, storage_options)
        source = Source(base, cache=cache, storage_options=storage_options)
        self._source = source  # _index needs it before _setup
        source.cache  # noqa: B018 - opened here once, not by each indexing thread at the same moment
        with ThreadPoolExecutor(8, thread_name_prefix="goodput-wds-index") as pool:
            indexes = list(pool.map(lambda item: self._index(*item), listing))
        self._samples = indexes
        spans = [
            FileSpan(name=name, size=info.size, samples=len(index), md5=info.md5)
            for (name, info), index in zip(listing, indexes, strict=True)
        ]
        self._setup(source, spans, augment=augment, open_files=open_files, extra=f"ext={self.extensions}")
        self._samples = [index for index in indexes if index]  # _setup keeps only shards with samples

    def _load(self, file: int, local: int) -> T:
        key, members = self._samples[file][local]
        start, end = members[0][1], members[-1][1] + members[-1][2]
        url = self.file_url(file)
        data = self._handles.get(file, lambda stack: self.buffer(file, stack))
        chunk = self._source.direct(url, start, end) if data is None else data[start:end]
        if len(chunk) != end - start:
            raise DataError(f"{url} is truncated: sample {key!r} (sample {local} of the shard) is cut off")
        sample: dict[str, Any] = {"__key__": key, "__url__": url}
        for ext, offset, size in members:
            sample[ext] = chunk[offset - start : offset - start + size]
        return self.decode(sample)

    def describe(self) -> dict[str, Any]:
        exts = sorted({ext for index in self._samples for _, members in index[:100] for ext, _, _ in members})
        return {**super().describe(), "keys": exts}

    def _index(self, name: str, info: RemoteInfo) -> list[tuple[str, Members]]:
        """Shard ``name``'s samples, from the index kept in the cache folder or by reading its tar headers."""
        url = self._source.url.rstrip("/") + "/" + name if name else self._source.url
        saved = self._saved_index_path(url, info)
        if saved is not None and os.path.exists(saved):
            with open(saved) as f:
                stored = json.load(f)
            samples = [
                (key, [(e, int(o), int(n)) for e, o, n in members]) for key, members in stored["samples"]
            ]
        else:
            with self._source.buffer(url, info) as data:
                samples = _scan(self._source.direct(url) if data is None else data, url)
            if saved is not None:
                tmp = f"{saved}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    json.dump({"version": _INDEX_VERSION, "samples": samples}, f)
                os.replace(tmp, saved)
        return [_select(key, members, self.extensions, url, i) for i, (key, members) in enumerate(samples)]

    def _saved_index_path(self, url: str, info: RemoteInfo) -> str | None:
        config = self._source.cache_config
        if config is None:
            return None
        folder = os.path.join(config.folder, "wds-index")
        os.makedirs(folder, exist_ok=True)
        identity = f"{_INDEX_VERSION}\n{url}\n{info.size}\n{info.md5}".encode()
        return os.path.join(folder, hashlib.sha256(identity).hexdigest()[:40] + ".json")


def _listing(
    urls: str | Sequence[str], cache: CacheConfig | None, options: Mapping[str, Any] | None
) -> tuple[str, list[tuple[str, RemoteInfo]]]:
    """(base URL, [(name under it, info)]) of the shards, in the order given (a folder: sorted)."""
    expanded = expand_urls(urls)
    if not expanded:
        raise ConfigError("WebDataset needs at least one shard URL or folder")
    if len(expanded) == 1 and not expanded[0].endswith(".tar"):
        folder = Source(expanded[0], cache=cache, storage_options=options)
        listing = list_files(folder, (".tar",))
        if not listing:
            raise DataError(f"{expanded[0]} holds no .tar shards")
        return expanded[0], listing
    base = os.path.commonprefix(expanded).rsplit("/", 1)[0]  # noqa: RUF071 - URLs: commonpath breaks s3://
    found = dict(list_files(Source(base, cache=cache, storage_options=options), (".tar",)))
    listing = []
    for url in expanded:
        name = url[len(base) :].lstrip("/")
        if name not in found:
            raise DataError(f"{url} does not exist: check the shard URLs or the brace pattern")
        listing.append((name, found[name]))
    return base, listing


def _scan(data: Buffer | bytes, url: str) -> list[tuple[str, Members]]:
    """Every sample of a tar shard from its headers: WebDataset's grouping of consecutive ``key.ext``."""
    listed = regular_members(data)  # None: a tar to leave to tarfile (which also names what is wrong)
    members, clean_end = (listed, True) if listed is not None else _tarfile_members(data, url)
    total = len(data)
    samples: list[tuple[str, Members]] = []
    for name, offset, size in members:
        if _META.match(name):
            continue
        match = _KEY.match(name)
        if match is None:
            raise DataError(f"{url}: member {name!r} has no extension: WebDataset members are named key.ext")
        key, ext = match.group(1), match.group(2).lower()
        if offset + size > total:
            raise DataError(
                f"{url} is truncated at byte {total}: sample {key!r} (sample {len(samples)} of the "
                "shard) is cut off; the shard must be written again or copied whole"
            )
        if not samples or samples[-1][0] != key:
            samples.append((key, []))
        elif any(e == ext for e, _, _ in samples[-1][1]):
            raise DataError(f"{url}: sample {key!r} has two members with extension {ext!r}")
        samples[-1][1].append((ext, offset, size))
    if not clean_end:
        after = f"after sample {samples[-1][0]!r}" if samples else "in its first header"
        raise DataError(f"{url} is truncated {after}: the shard must be written again or copied whole")
    return samples


def _tarfile_members(data: Buffer | bytes, url: str) -> tuple[list[tuple[str, int, int]], bool]:
    """The regular members as ``tarfile`` reads them, and whether only zeros follow the last header it read
    (it stops quietly at a header cut short)."""
    members = []
    try:
        with BufferFile(data) as file, tarfile.open(fileobj=file, mode="r:") as tar:
            for member in tar:
                if member.isreg():
                    members.append((member.name, member.offset_data, member.size))
                    if member.offset_data + member.size > len(data):
                        return members, True  # cut off: _scan names the sample; nothing follows it
            clean_end = not bytes(data[tar.offset :]).strip(b"\0")
    except tarfile.TarError as err:
        raise DataError(
            f"{url} is not a tar file ({err}): a WebDataset shard is a tar of key.ext members"
        ) from None
    return members, clean_end


def _select(
    key: str, members: Members, extensions: tuple[str, ...] | None, url: str, local: int
) -> tuple[str, Members]:
    if extensions is None:
        return key, members
    kept = [m for m in members if m[0] in extensions]
    missing = sorted(set(extensions) - {m[0] for m in kept})
    if missing:
        raise DataError(
            f"{url}: sample {key!r} (sample {local} of the shard) has no {', '.join(missing)} member; it has "
            f"{', '.join(m[0] for m in members)}"
        )
    return key, kept
