"""Fixtures shared by the whole suite: a real S3 server (SeaweedFS) on 127.0.0.1, and the chaos tests' reference run."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from goodput.testing import S3Server
from tests.helpers import demo

pytest_plugins = ["tests.helpers.cputime"]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One SeaweedFS server for the whole session, stopped (and its data removed) at the end."""
    server = S3Server(bucket="goodput-test")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_url(s3_server: S3Server) -> str:
    """A fresh, empty prefix inside the test bucket, as an s3:// URL."""
    return f"s3://{s3_server.bucket}/{uuid.uuid4().hex}"


@pytest.fixture(scope="session")
def demo_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The demo's data and one uninterrupted run of it, shared by the chaos tests (tests/helpers/demo.py)."""
    return demo.reference(str(tmp_path_factory.mktemp("demo-reference")))
