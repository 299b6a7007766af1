"""Reading remote objects through fsspec: retries with backoff, verified downloads, secrets kept out of text.

Everything here talks to the store; nothing here knows about the cache folder's budget or locks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from goodput._client_random import OWN_RANDOM
from goodput._storage_errors import (
    access_refused,
    code_of,
    describe,
    is_refusal,
    redact_url,
    status_of,
)
from goodput.errors import StorageError
from goodput.faults import fault_point

T = TypeVar("T")

# Error codes a store uses for "try again" (S3, GCS, Azure spellings).
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "ServerBusy",
        "OperationTimedOut",
        "RequestLimitExceeded",
    }
)
# Exceptions (by class name, so that no cloud SDK must be importable) that are never worth retrying.
_PERMANENT_NAMES = frozenset(
    {
        "FileNotFoundError",
        "PermissionError",
        "IsADirectoryError",
        "NotADirectoryError",
        "NoCredentialsError",
        "PartialCredentialsError",
        "ParamValidationError",
        "NoSuchBucket",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
    }
)


class ChecksumMismatch(OSError):
    """A downloaded object did not match its expected size or checksum (retried: the store may have hiccupped)."""


@dataclass(frozen=True)
class RemoteInfo:
    """What the store says about one object: its size and, where offered, its MD5 (hex)."""

    size: int
    md5: str | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter between attempts."""

    attempts: int
    backoff_s: float
    max_backoff_s: float

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based): uniform in [0, min(max, base*2^(n-1))]."""
        return OWN_RANDOM.uniform(0.0, min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))


def is_transient(err: BaseException) -> bool:
    """Whether an error from a store is worth retrying (5xx, throttling, resets, timeouts, bad checksums)."""
    names = {cls.__name__ for cls in type(err).__mro__}
    if names & _PERMANENT_NAMES:
        return False
    status = status_of(err)
    if status is not None:
        return status >= 500 or status in (408, 429)
    code = code_of(err)
    if code is not None:
        return code in _TRANSIENT_CODES
    if isinstance(err, (ConnectionError, TimeoutError, ChecksumMismatch)):
        return True
    # botocore/aiohttp connection and read errors, and OSError(EIO) from s3fs's translation of 5xx.
    transient_families = {"BotoCoreError", "ClientError", "ClientPayloadError", "ServerDisconnectedError"}
    return bool(names & transient_families) or type(err) is OSError


def call_with_retries(
    fn: Callable[[], T],
    *,
    url: str,
    policy: RetryPolicy,
    secrets: Iterable[str],
    on_retry: Callable[[BaseException], None] | None = None,
    cancelled: threading.Event | None = None,
    verb: str = "read",
) -> T:
    """Run ``fn`` until it succeeds, retrying transient errors with backoff.

    Raises:
        StorageError: after the last attempt, or at once for a permanent error; names the URL (without
            credentials) and the last cause.
        AccessRefused: at once when the store refused the credentials or the permission (a StorageError and
            a ConfigError: it says where credentials are read from).
    """
    secrets = list(secrets)
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except Exception as err:
            transient = is_transient(err)
            if not transient and is_refusal(err):  # no retry, and no restarted attempt, can fix it
                raise access_refused(url, err, verb=verb, secrets=secrets) from None
            if not transient or attempt == policy.attempts:
                what = f"after {attempt} attempts" if transient else "(not retried: permanent error)"
                message = f"cannot {verb} {redact_url(url)} {what}: {describe(err, secrets)}"
                raise StorageError(message) from None
            if on_retry is not None:
                on_retry(err)
            delay = policy.delay(attempt)
            if cancelled is not None:
                if cancelled.wait(delay):
                    raise StorageError(f"{verb} {redact_url(url)}: cancelled") from None
            else:
                time.sleep(delay)  # backoff between attempts, not synchronisation
    raise AssertionError("unreachable")


def info_of(fs: Any, path: str) -> RemoteInfo:
    """Size and MD5 (when the store offers one) of a remote object."""
    details = fs.info(path)
    return RemoteInfo(size=int(details["size"]), md5=md5_from_details(details))


def md5_from_details(details: Mapping[str, Any]) -> str | None:
    """The MD5 hex digest a listing/info entry carries, if any (S3 single-part ETag, GCS md5Hash)."""
    etag = details.get("ETag") or details.get("etag")
    if isinstance(etag, str):
        etag = etag.strip('"').lower()
        if re.fullmatch(r"[0-9a-f]{32}", etag):  # multipart ETags ("...-N") are not an MD5
            return etag
    md5_b64 = details.get("md5Hash")
    if isinstance(md5_b64, str):
        try:
            return base64.b64decode(md5_b64).hex()
        except (binascii.Error, ValueError):
            return None
    return None


def download(
    fs: Any,
    path: str,
    dest: str,
    expected: RemoteInfo,
    *,
    chunk_bytes: int,
    range_workers: int,
) -> None:
    """Write the object at ``path`` to the local file ``dest`` and verify its size and MD5.

    Objects larger than one chunk are fetched as range requests, ``range_workers`` at a time.

    Raises:
        ChecksumMismatch: when the bytes do not match ``expected``.
    """
    digest = hashlib.md5(usedforsecurity=False)
    size = expected.size
    with open(dest, "wb") as out:
        if size <= chunk_bytes:
            data = fs.cat_file(path)
            out.write(data)
            digest.update(data)
            written = len(data)
        elif range_workers <= 1:
            written = 0
            for start in range(0, size, chunk_bytes):
                data = fs.cat_file(path, start=start, end=min(start + chunk_bytes, size))
                out.write(data)
                digest.update(data)
                written += len(data)
        else:
            written = _parallel_ranges(fs, path, out.fileno(), size, chunk_bytes, range_workers)
            digest = _md5_of_file(dest)
        fault_point("cache_download")  # bytes on disk under the temporary name, not yet verified
        out.flush()
        os.fsync(out.fileno())
    if written != size:
        raise ChecksumMismatch(f"got {written} bytes, expected {size}")
    if expected.md5 is not None and digest.hexdigest() != expected.md5:
        raise ChecksumMismatch(f"MD5 {digest.hexdigest()} differs from the store's {expected.md5}")


def fetch_verified(fs: Any, path: str, expected: RemoteInfo) -> bytes:
    """The whole object at ``path`` in memory, checked against ``expected``'s size and MD5.

    Raises:
        ChecksumMismatch: when the bytes do not match ``expected``.
    """
    data = bytes(fs.cat_file(path))
    if len(data) != expected.size:
        raise ChecksumMismatch(f"got {len(data)} bytes, expected {expected.size}")
    if expected.md5 is not None:
        digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if digest != expected.md5:
            raise ChecksumMismatch(f"MD5 {digest} differs from the store's {expected.md5}")
    return data


def _parallel_ranges(fs: Any, path: str, fd: int, size: int, chunk: int, workers: int) -> int:
    def part(start: int) -> int:
        data = fs.cat_file(path, start=start, end=min(start + chunk, size))
        os.pwrite(fd, data, start)
        return len(data)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="goodput-range") as pool:
        return sum(pool.map(part, range(0, size, chunk)))


def _md5_of_file(path: str) -> Any:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            digest.update(block)
    return digest
