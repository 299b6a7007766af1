"""Shared pieces of the cache tests: objects on the real S3 server, options through the fault proxy."""

from __future__ import annotations

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
