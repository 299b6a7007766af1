"""Faults against the real S3 server: a server killed and restarted mid-epoch, 5xx bursts, dropped connections,
stalled and slow responses; the epoch completes with the right bytes. A permanent error is reported clearly,
and a download SIGKILLed mid-way is never served after a restart."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

from goodput.data.cache import CacheConfig, RemoteCache
from goodput.errors import StorageError
from goodput.testing import S3Server
from goodput.testing.faultproxy import FaultProxy
from tests.helpers.cache_helpers import read_one_in_process, upload, via

pytestmark = [pytest.mark.s3, pytest.mark.slow]


@pytest.fixture
def proxy(s3_server: S3Server):
    with FaultProxy(s3_server.s3_port) as p:
        yield p


def _cache(tmp_path, options, **kw) -> RemoteCache:
    kw.setdefault("attempts", 8)
    kw.setdefault("backoff_seconds", 0.05)
    kw.setdefault("max_backoff_seconds", 0.5)
    config = CacheConfig(folder=str(tmp_path / "cache"), budget_bytes=1 << 30, prefetch_bytes=1 << 20, **kw)
    return RemoteCache(config, storage_options=options)


def _epoch(cache: RemoteCache, objects: dict[str, bytes]) -> None:
    cache.prefetch(list(objects))
    for url, data in objects.items():
        assert cache.read(url) == data
    cache.close()


def _wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_server_killed_and_restarted_mid_epoch(tmp_path) -> None:
    with S3Server(bucket="restart") as server:
        objects = upload(server, "s3://restart/epoch", 10, 40_000)
        cache = _cache(tmp_path, via(server, timeout=2), attempts=40, max_backoff_seconds=0.5)
        urls = list(objects)
        for url in urls[:5]:
            assert cache.read(url) == objects[url]
        server.kill()
        results: dict[str, bytes] = {}
        reader = threading.Thread(target=lambda: results.update({u: cache.read(u) for u in urls[5:]}))
        reader.start()
        _wait_for(lambda: cache.metrics()["retries"] >= 1, "a retry against the dead server")
        server.start()
        reader.join(timeout=120)
        assert not reader.is_alive()
        assert results == {u: objects[u] for u in urls[5:]}


def test_5xx_bursts_and_dropped_connections(tmp_path, s3_server, s3_url, proxy) -> None:
    objects = upload(s3_server, s3_url, 8, 30_000)
    proxy.fail_next(6, status=503, code="SlowDown")
    proxy.fail_next(3, status=500, code="InternalError")
    proxy.drop_next(3, match=".bin")
    _epoch(_cache(tmp_path, via(s3_server, proxy.endpoint_url)), objects)
    assert proxy.injected() == {"fail": 9, "drop": 3}


def test_stalled_and_slow_responses(tmp_path, s3_server, s3_url, proxy) -> None:
    objects = upload(s3_server, s3_url, 6, 30_000)
    proxy.set(latency_s=0.05, bandwidth_bps=2_000_000)
    proxy.stall_next(2, seconds=3.0, match=".bin")
    cache = _cache(tmp_path, via(s3_server, proxy.endpoint_url, timeout=1.0))
    _epoch(cache, objects)
    assert proxy.injected() == {"stall": 2}


def test_permanent_errors_are_reported_clearly(tmp_path, s3_server, s3_url, proxy) -> None:
    ((url, _),) = upload(s3_server, s3_url, 1, 1000).items()
    proxy.fail_next(1000, status=503, code="SlowDown")
    cache = _cache(tmp_path, via(s3_server, proxy.endpoint_url), attempts=2)
    with pytest.raises(StorageError) as err:
        cache.read(url)
    message = str(err.value)
    assert message.startswith(f"cannot read {url} after 2 attempts:") and "(HTTP 503" in message
    assert s3_server.secret_key not in message and s3_server.access_key not in message
    proxy.clear_faults()
    with pytest.raises(StorageError, match=r"permanent error.*FileNotFoundError"):
        cache.read(url + "-missing")


def test_download_killed_mid_way_is_never_served(tmp_path, s3_server, s3_url, proxy) -> None:
    ((url, data),) = upload(s3_server, s3_url, 1, 2_000_000).items()
    proxy.set(bandwidth_bps=400_000)
    folder = str(tmp_path / "cache")
    child = multiprocessing.get_context("spawn").Process(
        target=read_one_in_process, args=(via(s3_server, proxy.endpoint_url), folder, url)
    )
    child.start()
    tmp_dir = os.path.join(folder, "tmp")

    def partial_on_disk() -> bool:
        names = os.listdir(tmp_dir) if os.path.isdir(tmp_dir) else []
        return any(os.path.getsize(os.path.join(tmp_dir, n)) > 0 for n in names)

    _wait_for(partial_on_disk, "a partial download")
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert child.exitcode == -signal.SIGKILL
    key = RemoteCache.key(url)
    assert not os.path.exists(os.path.join(folder, "files", key))
    proxy.set(bandwidth_bps=0)
    gets_before = sum(r.method == "GET" for r in proxy.records())
    restarted = _cache(tmp_path, via(s3_server, proxy.endpoint_url))
    assert os.listdir(tmp_dir) == []  # the dead download's partial file is gone
    assert restarted.read(url) == data
    assert restarted.metrics()["misses"] == 1  # downloaded again, not served from the partial
    assert sum(r.method == "GET" for r in proxy.records()) > gets_before
