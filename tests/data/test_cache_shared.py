"""More readers than a small shared cache has room for: none waits on room the others hold (hold and wait).

Four processes read one sharded dataset on the real S3 server, each in its own random order and keeping four
shards open, through one cache folder whose budget is a third of the data: more open shards than the budget
holds.

In the first test the S3 server is killed and restarted half-way, while the readers that got there first wait
with their shards open. Every read must return the right bytes, none may fail (before the first fix, readers
that held their shards and waited for room failed with "no room in the cache" after ``wait_seconds``), and the
budget must hold; a reader that hangs fails the bounded wait for its result. The paused readers' open shards
really are in use, so the others may read uncached once their wait for room runs out: the test keeps that wait
short.

In the second the readers never pause, so each holds nothing but the shard it reads while it waits for room:
no wait may run out. It fails when a reader waits for room inside the file's download lock: the readers queued
on that lock keep their open shards pinned instead of letting them go, and each such read runs out its wait.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from goodput.data.cache import CacheConfig, RemoteCache
from goodput.data.shards import write_shards
from goodput.testing import S3Server
from tests.helpers.cache_helpers import reader_main, shard_sample, via

pytestmark = [pytest.mark.s3, pytest.mark.slow]

SAMPLES = 80
SHARD_BYTES = 128 << 10
READERS = 4


def _read_together(
    tmp_path: Path, s3_server: S3Server, s3_url: str, *, wait_seconds: float, restart: bool
) -> tuple[list[dict[str, Any]], CacheConfig]:
    """Every reader's result (errors, wrong reads, the node's cache counters) and the cache's configuration;
    ``restart``: pause the readers half-way and restart the S3 server meanwhile."""
    index = write_shards(
        (shard_sample(i) for i in range(SAMPLES)),
        s3_url,
        shard_bytes=SHARD_BYTES,
        storage_options=s3_server.storage_options(),
    )
    data_bytes = sum(s["bytes"] for s in index["shards"])
    biggest = max(s["bytes"] for s in index["shards"])
    budget = data_bytes // 3
    assert READERS * 4 * biggest > budget  # the readers' open shards alone would overfill the budget
    config = CacheConfig(
        folder=str(tmp_path / "cache"),
        budget_bytes=budget,
        prefetch_bytes=budget // 4,
        attempts=60,
        backoff_seconds=0.05,
        max_backoff_seconds=0.5,
        wait_seconds=wait_seconds,
    )
    options = via(s3_server, timeout=2)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    halfway = [context.Event() for _ in range(READERS)]
    resume = context.Event()
    if not restart:
        resume.set()
    readers = [
        context.Process(
            target=reader_main,
            args=(queue, s3_url, options, config, seed, seed % 2 == 0, halfway[seed], resume),
        )
        for seed in range(READERS)
    ]
    for reader in readers:
        reader.start()
    try:
        if restart:
            deadline = time.monotonic() + 120
            while not all(event.is_set() for event in halfway):
                early = [
                    n for n, r in enumerate(readers) if r.exitcode is not None and not halfway[n].is_set()
                ]
                assert not early, (
                    f"readers {early} ended before half-way (exit codes {[r.exitcode for r in readers]})"
                )
                assert time.monotonic() < deadline, (
                    f"readers {[n for n, e in enumerate(halfway) if not e.is_set()]} hang"
                )
                halfway[0].wait(0.05)
            s3_server.kill()
            resume.set()  # the readers go on against a dead server and retry until it is back
            s3_server.start()
        results = [queue.get(timeout=120) for _ in readers]
    finally:
        resume.set()
        for reader in readers:
            reader.join(timeout=30)
            if reader.is_alive():
                reader.kill()
    assert [r["errors"] for r in results] == [[]] * READERS
    assert [r["wrong"] for r in results] == [0] * READERS
    assert RemoteCache(CacheConfig(folder=config.folder, budget_bytes=budget)).usage_bytes() <= budget
    assert results[0]["metrics"]["evictions"] > 0  # the budget really was smaller than the data
    return results, config


def test_readers_that_share_a_small_cache_never_wait_on_each_other(
    tmp_path: Path, s3_server: S3Server, s3_url: str
) -> None:
    _read_together(tmp_path, s3_server, s3_url, wait_seconds=0.5, restart=True)


def test_readers_that_keep_reading_find_room_before_their_wait_runs_out(
    tmp_path: Path, s3_server: S3Server, s3_url: str
) -> None:
    results, _ = _read_together(tmp_path, s3_server, s3_url, wait_seconds=5.0, restart=False)
    assert max(r["metrics"]["uncached_reads"] for r in results) == 0  # the node's count: no wait ran out
