"""RemoteCache against the real S3 server: right bytes, hits after the first read, warm restarts, LRU and
budget rules, pins, prefetch order and window, verification, and errors that name the URL but no secret."""

from __future__ import annotations

import itertools
import os
import pickle
import time

import pytest

from goodput.data._cacheindex import close_connections
from goodput.data._remote import ChecksumMismatch, RemoteInfo, is_transient, redact_url
from goodput.data.cache import CacheConfig, RemoteCache
from goodput.errors import ConfigError, DataError, StorageError
from goodput.testing import S3Server
from goodput.testing.faultproxy import FaultProxy
from tests.helpers.cache_helpers import upload, via

pytestmark = pytest.mark.s3
KB = 1000


@pytest.fixture
def proxy(s3_server: S3Server):
    with FaultProxy(s3_server.s3_port) as p:
        yield p


def _cache(tmp_path, server: S3Server, proxy: FaultProxy | None = None, **kw) -> RemoteCache:
    kw.setdefault("budget_bytes", 10 * 1000 * KB)
    kw.setdefault("prefetch_bytes", min(kw["budget_bytes"], 300 * KB))
    kw.setdefault("backoff_seconds", 0.01)
    config = CacheConfig(folder=str(tmp_path / "cache"), **kw)
    return RemoteCache(config, storage_options=via(server, proxy.endpoint_url if proxy else None))


def _gets(proxy: FaultProxy, url: str) -> list:
    path = "/" + url.removeprefix("s3://")
    return [r for r in proxy.records() if r.method == "GET" and r.path == path]


def test_reads_right_bytes_then_hits_and_survives_restart(tmp_path, s3_server, s3_url, proxy) -> None:
    objects = upload(s3_server, s3_url, 4, 50 * KB)
    cache = _cache(tmp_path, s3_server, proxy)
    for url, data in objects.items():
        assert cache.read(url) == data
    for url, data in objects.items():
        assert cache.read(url) == data
    assert cache.metrics()["misses"] == 4 and cache.metrics()["hits"] == 4
    assert cache.metrics()["bytes_downloaded"] == sum(len(d) for d in objects.values())
    before = len(proxy.records())
    restarted = _cache(tmp_path, s3_server, proxy)  # a new process would see the same folder
    assert all(restarted.read(url) == data for url, data in objects.items())
    assert restarted.metrics()["hits"] == 4 and len(proxy.records()) == before  # nothing went over the wire


def test_lru_evicts_least_recently_used_and_budget_holds(tmp_path, s3_server, s3_url) -> None:
    objects = list(upload(s3_server, s3_url, 4, 100 * KB).items())
    cache = _cache(tmp_path, s3_server, budget_bytes=3 * 100 * KB + 10)
    (a, _), (b, _), (c, _), (d, d_bytes) = objects
    for url in (a, b, c, a):  # a is now more recent than b
        cache.read(url)
    assert cache.read(d) == d_bytes
    files = set(os.listdir(tmp_path / "cache" / "files"))
    assert files == {RemoteCache.key(u) for u in (a, c, d)}
    assert cache.usage_bytes() <= 3 * 100 * KB + 10
    assert sum(os.path.getsize(tmp_path / "cache" / "files" / f) for f in files) <= 3 * 100 * KB + 10
    assert cache.metrics()["evictions"] == 1


def test_file_in_use_is_never_evicted(tmp_path, s3_server, s3_url) -> None:
    objects = list(upload(s3_server, s3_url, 4, 100 * KB).items())
    cache = _cache(tmp_path, s3_server, budget_bytes=2 * 100 * KB + 10)
    held_url, held_bytes = objects[0]
    with cache.open(held_url) as path:
        for url, data in objects[1:]:  # each needs room: only the other file may go
            assert cache.read(url) == data
        with open(path, "rb") as f:
            assert f.read() == held_bytes
        assert os.path.exists(path)


def test_a_read_with_no_room_goes_uncached(tmp_path, s3_server, s3_url) -> None:
    objects = list(upload(s3_server, s3_url, 2, 100 * KB).items())
    cache = _cache(tmp_path, s3_server, budget_bytes=150 * KB, prefetch_bytes=0, wait_seconds=0.2)
    with cache.open(objects[0][0]):
        assert cache.read(objects[1][0]) == objects[1][1]  # the other file holds the room: read uncached
        assert cache.metrics()["uncached_reads"] == 1 and cache.usage_bytes() <= 150 * KB
        with cache.open(objects[1][0]) as path:  # a caller that needs a path gets a private copy
            with open(path, "rb") as f:
                assert f.read() == objects[1][1]
            assert os.path.dirname(path).endswith("uncached")
        assert not os.path.exists(path) and cache.metrics()["uncached_reads"] == 2


def test_a_reader_lets_go_of_its_idle_files_before_it_waits(tmp_path, s3_server, s3_url) -> None:
    objects = list(upload(s3_server, s3_url, 2, 100 * KB).items())
    cache = _cache(tmp_path, s3_server, budget_bytes=150 * KB, prefetch_bytes=0, wait_seconds=60)
    idle = cache.open(objects[0][0])
    idle.__enter__()  # a shard this process keeps open but is not reading
    started = time.monotonic()
    with cache.view(objects[1][0], release=lambda: idle.__exit__(None, None, None)) as data:
        assert data[:] == objects[1][1]
    assert time.monotonic() - started < 30  # no wait for the room it held itself
    assert cache.metrics()["uncached_reads"] == 0 and cache.metrics()["evictions"] == 1


def test_a_read_breaks_a_prefetch_window_before_going_uncached(tmp_path, s3_server, s3_url) -> None:
    objects = list(upload(s3_server, s3_url, 3, 100 * KB).items())
    cache = _cache(tmp_path, s3_server, budget_bytes=250 * KB, prefetch_bytes=250 * KB, wait_seconds=60)
    windowed = [url for url, _ in objects[:2]]
    for url in windowed:
        cache.read(url)
        cache._pin_window(url)  # what a prefetcher holds for reads to come
    assert cache.read(objects[2][0]) == objects[2][1]
    assert cache.metrics()["uncached_reads"] == 0 and cache.metrics()["evictions"] == 1
    assert cache.read(windowed[0]) == objects[0][1]  # its reader downloads it again


def test_file_larger_than_budget_is_refused(tmp_path, s3_server, s3_url) -> None:
    ((url, _),) = upload(s3_server, s3_url, 1, 100 * KB).items()
    cache = _cache(tmp_path, s3_server, budget_bytes=50 * KB)
    with pytest.raises(DataError, match="more than the cache budget"):
        cache.read(url)


def test_prefetch_downloads_in_plan_order_and_protects_the_window(tmp_path, s3_server, s3_url, proxy) -> None:
    plan = list(upload(s3_server, s3_url, 6, 100 * KB).items())
    others = list(upload(s3_server, s3_url + "-other", 3, 100 * KB, seed=1).items())
    cache = _cache(
        tmp_path,
        s3_server,
        proxy,
        budget_bytes=4 * 100 * KB + 50,
        prefetch_bytes=2 * 100 * KB + 20,
        prefetch_workers=1,
    )
    cache.prefetch([u for u, _ in plan])
    deadline = time.monotonic() + 30
    first_two = [RemoteCache.key(u) for u, _ in plan[:2]]
    while not all(cache._is_ready(k) for k in first_two):  # the prefetch runs in the background
        assert time.monotonic() < deadline, "prefetch made no progress"
        time.sleep(0.01)
    for url, data in others:  # pressure on the budget: the window must stay
        assert cache.read(url) == data
    assert all(cache._is_ready(k) for k in first_two)
    assert not cache._is_ready(
        RemoteCache.key(plan[2][0])
    )  # the window is 2 files: the third waits for reads
    for url, data in plan:
        assert cache.read(url) == data
    cache.close()
    order = [r.path for r in proxy.records() if r.method == "GET" and "-other" not in r.path]
    assert order == sorted(order)  # plan order, one download each
    assert len(order) == 6
    assert cache.metrics()["hits"] >= 2 and cache.metrics()["prefetch_lead_seconds"] > 0


def test_a_prefetch_inside_the_running_plan_keeps_it(tmp_path, s3_server, s3_url, proxy) -> None:
    # the loader asks for each upcoming batch's files at every step: that must not restart the plan (a restart
    # would move the asked-for file to the front and cost the training loop a thread join per step)
    plan = list(upload(s3_server, s3_url, 6, 100 * KB).items())
    cache = _cache(tmp_path, s3_server, proxy, prefetch_bytes=2 * 100 * KB + 20, prefetch_workers=1)
    cache.prefetch([u for u, _ in plan])
    running = cache._prefetcher._thread
    for url, _ in reversed(plan):
        cache.prefetch([url])
    assert cache._prefetcher._thread is running
    for url, data in plan:
        assert cache.read(url) == data
    cache.prefetch([plan[0][0]])  # the plan may have ended: its files are in the cache, nothing to start
    others = list(upload(s3_server, s3_url + "-other", 1, 100 * KB, seed=1).items())
    cache.prefetch([others[0][0]])  # a file outside it starts a new plan
    assert cache.read(others[0][0]) == others[0][1]
    cache.close()
    order = [r.path for r in proxy.records() if r.method == "GET"]
    assert order[:6] == sorted(order[:6]) and len(order) == 7  # plan order, one download each


def test_bad_checksum_is_never_served(tmp_path, s3_server, s3_url) -> None:
    ((url, data),) = upload(s3_server, s3_url, 1, 10 * KB).items()
    cache = _cache(tmp_path, s3_server, attempts=2)
    with pytest.raises(StorageError, match="after 2 attempts: ChecksumMismatch"):
        cache.read(url, expected=RemoteInfo(size=len(data), md5="0" * 32))
    assert os.listdir(tmp_path / "cache" / "files") == []
    assert os.listdir(tmp_path / "cache" / "tmp") == []
    assert cache.usage_bytes() == 0
    assert cache.read(url) == data  # the store's own ETag verifies


def test_errors_name_the_url_and_no_credential(tmp_path, s3_server, s3_url) -> None:
    ((url, _),) = upload(s3_server, s3_url, 1, 10 * KB).items()
    good = _cache(tmp_path, s3_server)
    with pytest.raises(StorageError) as missing:
        good.read(url + ".missing")
    assert url + ".missing" in str(missing.value) and "FileNotFoundError" in str(missing.value)
    options = via(s3_server)
    options["secret"] = "wrong-" + s3_server.secret_key[:8]
    bad = RemoteCache(
        CacheConfig(folder=str(tmp_path / "c2"), budget_bytes=10**6, prefetch_bytes=0),
        storage_options=options,
    )
    with pytest.raises(StorageError) as refused:
        bad.read(url)
    text = str(refused.value) + repr(refused.value) + repr(bad) + str(pickle.dumps(bad.config))
    assert url in text and "permanent" in text
    for secret in (options["secret"], s3_server.access_key, s3_server.secret_key):
        assert secret not in text


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="budget_bytes"):
        CacheConfig(folder="/tmp/x", budget_bytes=0)
    with pytest.raises(ConfigError, match="prefetch_bytes"):
        CacheConfig(folder="/tmp/x", budget_bytes=10, prefetch_bytes=20)
    with pytest.raises(ConfigError, match="folder"):
        CacheConfig(folder="s3://bucket/cache", budget_bytes=10, prefetch_bytes=0)


def test_a_budget_below_the_default_window_clamps_the_window() -> None:
    small = CacheConfig(folder="/tmp/x", budget_bytes=64 << 20)
    assert small.prefetch_bytes == 64 << 20  # the default 256 MiB window would not fit
    assert CacheConfig(folder="/tmp/x", budget_bytes=1 << 30).prefetch_bytes == 256 << 20


def test_stale_temp_files_of_dead_processes_are_cleaned(tmp_path, s3_server) -> None:
    cache = _cache(tmp_path, s3_server)
    tmp = tmp_path / "cache" / "tmp"
    stale = tmp / f"{'a' * 40}.999999999-1.part"
    stale.write_bytes(b"partial")
    orphan = tmp_path / "cache" / "files" / ("b" * 40)
    orphan.write_bytes(b"renamed but never recorded")
    _cache(tmp_path, s3_server)
    assert not stale.exists() and not orphan.exists()
    assert cache.usage_bytes() == 0


@pytest.mark.parametrize(
    ("err", "transient"),
    [
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (ChecksumMismatch("x"), True),
        (OSError(5, "EIO"), True),
        (FileNotFoundError("gone"), False),
        (PermissionError("denied"), False),
        (ValueError("bad"), False),
    ],
)
def test_transient_classification(err: BaseException, transient: bool) -> None:
    assert is_transient(err) is transient


def test_redact_url_drops_userinfo_and_query() -> None:
    assert redact_url("https://user:pw@host/a/b?X-Amz-Signature=abc") == "https://host/a/b?<redacted>"
    assert redact_url("s3://bucket/key") == "s3://bucket/key"


def test_damaged_index_is_rebuilt_and_unknown_files_dropped(tmp_path, s3_server, s3_url) -> None:
    ((url, data),) = upload(s3_server, s3_url, 1, 10 * KB).items()
    assert _cache(tmp_path, s3_server).read(url) == data
    close_connections()  # as after a reboot: no process has the index open
    for suffix in ("-wal", "-shm"):
        (tmp_path / "cache" / f"index.sqlite{suffix}").unlink(missing_ok=True)
    (tmp_path / "cache" / "index.sqlite").write_bytes(b"not a database" * 100)
    cache = _cache(tmp_path, s3_server)
    assert os.listdir(tmp_path / "cache" / "files") == []
    assert cache.read(url) == data and cache.metrics()["misses"] == 1


def test_large_object_is_fetched_with_parallel_range_requests(tmp_path, s3_server, s3_url, proxy) -> None:
    ((url, data),) = upload(s3_server, s3_url, 1, 1_000_000).items()
    proxy.set(latency_s=0.05)  # long enough that the parts overlap in time
    cache = _cache(tmp_path, s3_server, proxy, chunk_bytes=128_000, range_workers=4)
    assert cache.read(url) == data
    parts = sorted(_gets(proxy, url), key=lambda r: r.start)
    assert len(parts) == 8 and all(r.range and r.range.startswith("bytes=") for r in parts)
    assert any(b.start < a.end for a, b in itertools.pairwise(parts))  # several in flight at once


_EXITS = """
import json, sys
from goodput.data.cache import CacheConfig, RemoteCache
config, options, urls = json.loads(sys.stdin.read())  # not argv: the credentials stay out of errors
cache = RemoteCache(CacheConfig(**config), storage_options=options)
held = cache.open(urls[0])
held.__enter__()  # kept open: the budget has no room for the next file
cache.prefetch(urls[1:])
import threading, time
deadline = time.monotonic() + 30
while not any(t.name.startswith("goodput-fetch") for t in threading.enumerate()):
    assert time.monotonic() < deadline, "no download started"
    time.sleep(0.01)  # polling for the download's thread
print("prefetch waiting for room", flush=True)
"""  # the script ends without closing the cache, its download still waiting


def test_a_process_whose_prefetch_waits_for_room_still_exits(tmp_path, s3_server, s3_url) -> None:
    """A download that waits for room no reader will free (its loader is gone) must not keep the interpreter
    from exiting (the interpreter joins a thread pool's workers at exit)."""
    import json
    import subprocess
    import sys

    urls = list(upload(s3_server, s3_url, 3, 100 * KB))
    config = {"folder": str(tmp_path / "cache"), "budget_bytes": 150 * KB, "prefetch_bytes": 150 * KB}
    argv = json.dumps([config, via(s3_server), urls])
    proc = subprocess.run(
        [sys.executable, "-c", _EXITS], input=argv, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "prefetch waiting for room" in proc.stdout, proc.stderr[-2000:]
