"""Four processes read the same objects through one cache folder whose budget is smaller than the data.

Every read returns the right bytes, the budget holds on disk, and the fault proxy's request log (what really
went over the wire) shows that no object was ever being downloaded twice at the same time.
"""

from __future__ import annotations

import itertools
import multiprocessing
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

import pytest

from goodput.data.cache import CacheConfig, RemoteCache
from goodput.testing.faultproxy import FaultProxy
from tests.helpers.cache_helpers import md5, read_all_in_process, upload, via

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def test_four_processes_share_one_cache_under_a_small_budget(tmp_path, s3_server, s3_url) -> None:
    objects = upload(s3_server, s3_url, 16, 64_000)
    expected = {url: md5(data) for url, data in objects.items()}
    budget = 6 * 64_100
    folder = str(tmp_path / "cache")
    with FaultProxy(s3_server.s3_port, latency_s=0.005) as proxy:
        options = via(s3_server, proxy.endpoint_url)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(4, mp_context=context) as pool:
            futures = [
                pool.submit(read_all_in_process, options, folder, budget, expected, seed, 2)
                for seed in range(4)
            ]
            results = [f.result(timeout=240) for f in futures]
        records = proxy.records()

    assert [r["wrong"] for r in results] == [0, 0, 0, 0]
    assert max(r["most_on_disk"] for r in results) <= budget
    node = RemoteCache(CacheConfig(folder=folder, budget_bytes=budget, prefetch_bytes=0))
    assert node.usage_bytes() <= budget

    gets: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        if r.method == "GET":
            gets[r.path].append((r.start, r.end))
    for path, spans in gets.items():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, f"{path} was being downloaded twice at once"
    reads = sum(r["metrics"]["hits"] + r["metrics"]["misses"] for r in results)
    downloads = sum(len(s) for s in gets.values())
    assert reads == 4 * 2 * 16
    assert downloads < reads  # processes shared downloads and hits
    assert node.node_metrics()["evictions"] > 0  # the budget really was smaller than the data
