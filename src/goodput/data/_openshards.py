"""The shard files one process holds open, most recently used first, for the formats that pack many samples
per file (goodput shards, WebDataset tar, MDS).

A shuffled order jumps between shards, and opening one costs more than reading a sample (a pin in the cache's
index, a mapping, a header parse), so each process keeps the last ``limit`` shards open. Through a cache an
open shard is pinned against eviction; when the cache needs room, the open shards that are not being read are
let go first (the cache's ``release`` hook), so that a reader never holds files while it waits for others.
Without a cache a remote shard is read by ranges, and a local one is mapped.
"""

from __future__ import annotations

import contextlib
import mmap
from collections import OrderedDict
from typing import Any

from goodput.data._remote import RemoteInfo
from goodput.data._source import Source

Buffer = bytes | mmap.mmap


class OpenShards:
    """An LRU of open shard buffers over one :class:`Source`; picklable (a copy starts with none open)."""

    def __init__(self, source: Source, limit: int) -> None:
        self.source = source
        self.limit = limit
        self._open: OrderedDict[str, tuple[contextlib.ExitStack, Buffer]] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["source"], state["limit"])  # type: ignore[misc]

    @property
    def ranged(self) -> bool:
        """Whether shards are read by ranges straight from the store (remote, no cache)."""
        return self.source.cache is None and not self.source.is_local

    def read(self, url: str, info: RemoteInfo, start: int, end: int) -> bytes:
        """Bytes [start, end) of the shard at ``url`` (``info``: its size and checksum)."""
        if self.ranged:
            return self.source.direct(url, start, end)
        return self.buffer(url, info)[start:end]

    def buffer(self, url: str, info: RemoteInfo) -> Buffer:
        """The whole shard at ``url``, opened if needed; valid until it is closed (``limit`` opens later)."""
        held = self._open.get(url)
        if held is not None:
            self._open.move_to_end(url)
            return held[1]
        while len(self._open) >= self.limit:
            self._close_oldest()
        stack = contextlib.ExitStack()
        try:
            cache = self.source.cache
            if cache is not None:
                data = stack.enter_context(cache.view(url, expected=info, release=self.release))
            elif self.source.is_local:
                data = stack.enter_context(_mapped(self.source.local_path(url)))
            else:
                data = self.source.direct(url)
        except BaseException:
            stack.close()
            raise
        self._open[url] = (stack, data)
        return data

    def release(self) -> None:
        """Close every open shard (none is being read while another is opened)."""
        while self._open:
            self._close_oldest()

    def _close_oldest(self) -> None:
        _, (stack, _) = self._open.popitem(last=False)
        stack.close()


@contextlib.contextmanager
def _mapped(path: str) -> Any:
    with open(path, "rb") as f:
        if not f.seek(0, 2):
            yield b""  # an empty file cannot be mapped
            return
        view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield view
    finally:
        view.close()
