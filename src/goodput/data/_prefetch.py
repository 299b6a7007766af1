"""Background prefetch for a RemoteCache: download files in the order they will be read, a bounded window ahead.

The window is the files of the plan that are downloaded (or downloading) and not yet read. Its bytes are bounded
by ``prefetch_bytes`` and its downloads in flight by ``prefetch_workers``; its files are pinned so eviction
cannot take them before they are read. Reads are observed through the shared index (a file's ``last_hit``),
so readers in other processes (DataLoader workers) advance the window too.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from goodput.data._remote import RemoteInfo
from goodput.errors import GoodputError

if TYPE_CHECKING:
    from goodput.data.cache import RemoteCache

log = logging.getLogger(__name__)

# How often the window checks for reads by other processes while it is full. The readers live in other
# processes and write only to the shared index, so this is a poll, not a wait on an event.
_POLL_SECONDS = 0.01
_RECHECK_SECONDS = 1.0  # how long a file seen in the cache's folder is taken as still there


class Prefetcher:
    """Runs one prefetch plan at a time for one cache, in a background thread."""

    def __init__(self, cache: RemoteCache) -> None:
        self._cache = cache
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._planned: frozenset[str] = frozenset()  # the URLs of the running (or last) plan
        self._present: dict[str, float] = {}  # url -> when its file was last seen in the cache's folder

    def start(self, plan: Sequence[tuple[str, RemoteInfo | None]]) -> None:
        """Replace the running plan (if any) with ``plan``: (url, expected info) in reading order.

        A plan that adds nothing keeps the one there is: every URL in it is part of the running plan, or of
        a finished one and still in the cache. The loader asks for each batch's files as it delivers the
        batch before, so this is the common case, and restarting a plan (joining its thread and pool, then
        pinning its window again) would cost milliseconds on the training loop's path at every step.
        """
        urls = frozenset(url for url, _ in plan)
        if urls <= self._planned and self._covers(urls):
            return
        self.stop()
        self._planned = urls
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(list(plan), self._stop), name="goodput-cache-prefetch", daemon=True
        )
        self._thread.start()

    def _covers(self, urls: frozenset[str]) -> bool:
        thread = self._thread
        if thread is not None and thread.is_alive():
            return True
        # A file in the cache's folder is complete (downloads are renamed into place); one seen there less than
        # a second ago is taken as still there (a stat per file per batch was a tenth of a millisecond). If it
        # is evicted before it is read, the read downloads it: the prefetch only buys lead time.
        now = time.monotonic()
        for url in urls:
            if now - self._present.get(url, -_RECHECK_SECONDS) < _RECHECK_SECONDS:
                continue
            if not os.path.exists(self._cache._local(self._cache.key(url))):
                return False
            self._present[url] = now
        return True

    def stop(self) -> None:
        """Stop the plan; downloads in flight finish (or give up at their next retry)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._planned = frozenset()
        self._present = {}

    def _run(self, plan: list[tuple[str, RemoteInfo | None]], stop: threading.Event) -> None:
        config = self._cache.config
        started = time.time()
        window: dict[str, int] = {}  # url -> bytes, in plan order
        # Daemon threads, not a ThreadPoolExecutor: the interpreter joins an executor's workers at exit, so a
        # download waiting for room that no reader will free (a plan whose loader is gone) would keep the
        # process from exiting.
        inflight: list[threading.Thread] = []
        try:
            for url, known in plan:
                info = known if known is not None else self._cache._remote_info(url, stop)
                if info is None:
                    continue
                size = info.size
                while not stop.is_set():
                    self._release_read(window, started)
                    inflight = [t for t in inflight if t.is_alive()]
                    fits = not window or sum(window.values()) + size <= config.prefetch_bytes
                    if fits and len(inflight) < config.prefetch_workers:
                        break
                    stop.wait(_POLL_SECONDS)
                if stop.is_set():
                    break
                self._cache._pin_window(url)
                window[url] = size
                if not self._cache._is_ready(self._cache.key(url)):
                    fetch = threading.Thread(
                        target=self._fetch, args=(url, info, stop), name="goodput-fetch", daemon=True
                    )
                    fetch.start()
                    inflight.append(fetch)
            while window and not stop.is_set():  # keep the tail protected until it is read
                self._release_read(window, started)
                stop.wait(_POLL_SECONDS)
        finally:
            stop.set()
            for fetch in inflight:
                fetch.join()  # downloads in flight finish (or give up at their next retry)
            for url in window:
                self._cache._unpin_window(url)

    def _release_read(self, window: dict[str, int], since: float) -> None:
        if not window:
            return
        keys = {self._cache.key(url): url for url in window}
        for key in self._cache._index.hit_since(keys, since):
            url = keys[key]
            del window[url]
            self._cache._unpin_window(url)

    def _fetch(self, url: str, info: RemoteInfo | None, stop: threading.Event) -> None:
        key = self._cache.key(url)
        try:
            while not stop.is_set():
                if self._cache._ensure(url, key, info, demand=False, cancelled=stop):
                    return
                stop.wait(_POLL_SECONDS * 5)  # no room yet: readers have to release files first
        except GoodputError as err:
            # The read itself will retry and report; a prefetch failure only costs the lead.
            log.warning("prefetch failed: %s", err)
