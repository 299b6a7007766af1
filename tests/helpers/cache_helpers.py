"""Shared pieces of the cache tests: objects on the real S3 server, options through the fault proxy."""

from __future__ import annotations

import contextlib
import hashlib
import random
from typing import Any

import fsspec

from goodput.testing import S3Server


def upload(server: S3Server, url: str, count: int, size: int, seed: int = 0) -> dict[str, bytes]:
    """``count`` random objects of about ``size`` bytes under ``url``; returns url -> content."""
    rng = random.Random(seed)
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **server.storage_options())
    objects = {f"{url}/f{i:03d}.bin": rng.randbytes(size + i) for i in range(count)}
    fs.pipe(objects)
    return objects


def via(server: S3Server, endpoint_url: str | None = None, *, timeout: float | None = None) -> dict[str, Any]:
    """s3fs options reaching ``server`` (or a proxy in front of it) with the SDK's own retries off, so that
    the cache's retry layer is what the tests exercise."""
    options = server.storage_options()
    options["client_kwargs"] = dict(
        options["client_kwargs"], endpoint_url=endpoint_url or server.endpoint_url
    )
    config: dict[str, Any] = {"retries": {"max_attempts": 1, "mode": "standard"}}
    if timeout is not None:
        config.update(connect_timeout=timeout, read_timeout=timeout)
    options["config_kwargs"] = config
    return options


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def read_all_in_process(
    options: dict[str, Any], folder: str, budget: int, expected: dict[str, str], seed: int, rounds: int
) -> dict[str, Any]:
    """One reader process: read every object ``rounds`` times in its own random order through the cache
    folder; check each content's MD5 and the bytes of complete files on disk after every read."""
    import os

    from goodput.data.cache import CacheConfig, RemoteCache

    config = CacheConfig(folder=folder, budget_bytes=budget, prefetch_bytes=0, backoff_seconds=0.05)
    cache = RemoteCache(config, storage_options=options)
    rng = random.Random(seed)
    wrong, most_on_disk = 0, 0
    files = os.path.join(folder, "files")
    for _ in range(rounds):
        urls = list(expected)
        rng.shuffle(urls)
        for url in urls:
            wrong += md5(cache.read(url)) != expected[url]
            on_disk = 0
            for entry in os.scandir(files):
                with contextlib.suppress(FileNotFoundError):  # evicted by another process meanwhile
                    on_disk += entry.stat().st_size
            most_on_disk = max(most_on_disk, on_disk)
    return {"wrong": wrong, "most_on_disk": most_on_disk, "metrics": cache.metrics()}


def read_one_in_process(options: dict[str, Any], folder: str, url: str) -> None:
    """A child process that reads one object through the cache in small sequential range requests (so a
    partial file sits in tmp/ while it runs); the test SIGKILLs it mid-way."""
    from goodput.data.cache import CacheConfig, RemoteCache

    config = CacheConfig(
        folder=folder, budget_bytes=1 << 30, prefetch_bytes=0, chunk_bytes=64 << 10, range_workers=1
    )
    RemoteCache(config, storage_options=options).read(url)


def shard_sample(index: int) -> bytes:
    """Sample ``index`` of the shared-cache tests: 4 to 60 KiB of bytes fixed by the index."""
    rng = random.Random(index)
    return rng.randbytes(rng.randint(4 << 10, 60 << 10))


def read_shards_in_process(
    url: str, options: dict[str, Any], config: Any, seed: int, prefetch: bool, halfway: Any, resume: Any
) -> dict[str, Any]:
    """One reader process: every sample of the sharded dataset at ``url`` once, in its own random order, through
    the shared cache folder (``open_shards=4``). Sets ``halfway`` after half the samples and then waits for
    ``resume`` (the test restarts the S3 server in between). Returns the wrong and failed reads."""
    from goodput.data.shards import ShardedDataset

    dataset: Any = ShardedDataset(url, cache=config, storage_options=options, open_shards=4)
    order = list(range(len(dataset)))
    random.Random(seed).shuffle(order)
    if prefetch:
        dataset.prefetch(order)
    wrong, errors = 0, []
    for step, index in enumerate(order):
        if step == len(order) // 2:
            halfway.set()
            resume.wait(120)
        try:
            wrong += dataset[index] != shard_sample(index)
        except Exception as err:
            errors.append(f"sample {index}: {type(err).__name__}: {err}")
            break
    halfway.set()
    dataset.close()
    return {"wrong": wrong, "errors": errors, "metrics": dataset.cache_metrics()}


def reader_main(queue: Any, *args: Any) -> None:
    """Process target: run :func:`read_shards_in_process` and put its result on ``queue``."""
    queue.put(read_shards_in_process(*args))
