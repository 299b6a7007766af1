"""A real TCP store on 127.0.0.1 for the warm tests that talk to one."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from goodput.testing import free_port


@pytest.fixture
def tcp_store() -> Iterator[tuple[str, dist.TCPStore]]:
    """A fresh store's ``host:port`` and its server side, closed after the test."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=30))
    yield f"127.0.0.1:{port}", server
    del server
