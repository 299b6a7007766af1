"""The S3 fixture is a real server: bytes round-trip, wrong keys are refused, a restart keeps data."""

from __future__ import annotations

import fsspec
import pytest

from goodput.testing import S3Server

pytestmark = pytest.mark.s3


def test_round_trip_and_listing(s3_server: S3Server, s3_url: str) -> None:
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3_server.storage_options())
    payload = bytes(range(256)) * 1000
    fs.pipe(f"{s3_url}/a.bin", payload)
    assert fs.cat(f"{s3_url}/a.bin") == payload
    assert [p.rsplit("/", 1)[-1] for p in fs.ls(s3_url)] == ["a.bin"]


def test_wrong_credentials_are_refused(s3_server: S3Server, s3_url: str) -> None:
    opts = s3_server.storage_options() | {"secret": "not-the-secret"}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **opts)
    with pytest.raises((PermissionError, OSError)):
        fs.pipe(f"{s3_url}/b.bin", b"x")
