"""Which format a URL holds, and the dataset that reads it: the table behind ``goodput data inspect``.

``FORMATS`` is tried in order; the first entry whose ``detect`` says yes opens the URL. ``detect`` sees the
names under the URL (relative to it; the file's own name when the URL is one file) and may read a small file
(an index) through the Source. Each entry names the options it takes (``seq_len``, ``columns``, ...), so a
command line can refuse an option that a format does not use. A new format adds one entry here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from goodput._storage_errors import secret_values
from goodput.data._remote import call_with_retries
from goodput.data._source import DEFAULT_RETRY, Source, join_url
from goodput.errors import ConfigError, DataError

__all__ = ["FORMATS", "Format", "detect_format", "open_dataset"]


@dataclass(frozen=True)
class Format:
    """One format: its name, how to recognise it, how to open it, and the options it takes."""

    name: str
    detect: Callable[[Source, Sequence[str]], bool]
    open: Callable[..., Any]  # open(url, cache=..., storage_options=..., **options) -> dataset
    options: tuple[str, ...] = ()


def _suffix(*suffixes: str) -> Callable[[Source, Sequence[str]], bool]:
    return lambda _source, names: any(n.endswith(suffixes) for n in names)


def _is_goodput_shards(source: Source, names: Sequence[str]) -> bool:
    from goodput.data.shards import FORMAT, INDEX_NAME

    if INDEX_NAME not in names:
        return False
    try:
        return bool(json.loads(source.direct(join_url(source.url, INDEX_NAME))).get("format") == FORMAT)
    except ValueError:
        return False


def _is_hf_saved(_source: Source, names: Sequence[str]) -> bool:
    from goodput.data.arrow import STATE_NAME

    return STATE_NAME in names or any(n.endswith(".arrow") for n in names)


def _is_mds(source: Source, names: Sequence[str]) -> bool:
    if "index.json" not in names:
        return False
    try:
        shards = json.loads(source.direct(join_url(source.url, "index.json"))).get("shards", [])
    except ValueError:
        return False
    return bool(shards) and all(isinstance(s, dict) and s.get("format") == "mds" for s in shards)


def _open_mds(url: str, **kw: Any) -> Any:
    from goodput.data.mds import MDSDataset

    return MDSDataset(url, **kw)


def _open_webdataset(url: str, **kw: Any) -> Any:
    from goodput.data.webdataset import WebDataset

    return WebDataset(url, **kw)


def _open_shards(url: str, **kw: Any) -> Any:
    from goodput.data.shards import ShardedDataset

    return ShardedDataset(url, **kw)


def _open_arrow(url: str, **kw: Any) -> Any:
    from goodput.data.arrow import ArrowDataset

    return ArrowDataset(url, **kw)


def _open_parquet(url: str, **kw: Any) -> Any:
    from goodput.data.parquet import ParquetDataset

    return ParquetDataset(url, **kw)


def _open_tokens(url: str, **kw: Any) -> Any:
    from goodput.data.tokens import TokenDataset

    if kw.get("seq_len") is None:
        raise ConfigError(f"{url} holds token files: pass the window length (--seq-len / seq_len=)")
    return TokenDataset(url, **kw)


def _open_folder(url: str, **kw: Any) -> Any:
    from goodput.data.folder import FolderDataset

    return FolderDataset(url, decode=bytes, **kw)


# Tried in order: an index that names its format first, then suffixes, a plain folder last.
# A new format adds its entry before "folder" (goodput-shards only claims an index.json whose "format" is its own).
FORMATS: list[Format] = [
    Format("goodput-shards", _is_goodput_shards, _open_shards),
    Format("mds", _is_mds, _open_mds, ("columns",)),
    Format("webdataset", _suffix(".tar"), _open_webdataset),
    Format("arrow", _is_hf_saved, _open_arrow, ("columns",)),
    Format("parquet", _suffix(".parquet"), _open_parquet, ("columns", "split")),
    Format("tokens", _suffix(".bin", ".npy"), _open_tokens, ("seq_len", "dtype")),
    Format("folder", lambda _source, names: bool(names), _open_folder),
]


def _names(source: Source) -> list[str]:
    fs = source.fs
    root = str(fs._strip_protocol(source.url)).rstrip("/")
    secrets = secret_values(source.options)
    info = call_with_retries(lambda: fs.info(root), url=source.url, policy=DEFAULT_RETRY, secrets=secrets)
    if info.get("type") == "file":
        return [root.rsplit("/", 1)[-1]]
    found = call_with_retries(lambda: fs.find(root), url=source.url, policy=DEFAULT_RETRY, secrets=secrets)
    return [str(p)[len(root) :].lstrip("/") for p in found]


def detect_format(url: str, *, storage_options: Mapping[str, Any] | None = None) -> Format:
    """The first entry of ``FORMATS`` that recognises ``url``.

    Raises:
        DataError: nothing is at ``url``.
    """
    source = Source(url, cache=None, storage_options=storage_options)
    names = _names(source)
    for entry in FORMATS:
        if entry.detect(source, names):
            return entry
    raise DataError(f"{url} holds no files")


def open_dataset(
    url: str,
    *,
    format: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> tuple[Format, Any]:
    """The format of ``url`` (detected unless given) and a dataset reading it with ``options``.

    Raises:
        ConfigError: an unknown format, or an option the format does not take.
    """
    if format is None:
        entry = detect_format(url, storage_options=storage_options)
    else:
        known = {f.name: f for f in FORMATS}
        if format not in known:
            raise ConfigError(f"unknown format {format!r}: choose one of {', '.join(known)}")
        entry = known[format]
    given = {k: v for k, v in options.items() if v is not None}
    unused = sorted(set(given) - set(entry.options))
    if unused:
        raise ConfigError(f"{url} is {entry.name}, which takes no {', '.join(unused)}: drop it")
    return entry, entry.open(url, storage_options=storage_options, **given)
