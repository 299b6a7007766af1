"""The S3 fixture is a real server: bytes round-trip, wrong keys are refused, a restart keeps data."""

from __future__ import annotations

import glob
import os
import socket
from pathlib import Path

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


def test_the_fault_proxy_delays_a_stalled_request_and_then_answers_it_whole(
    s3_server: S3Server, s3_url: str
) -> None:
    """A stall is a delay only: the held request is forwarded and its response relayed whole (the old proxy
    also cut it mid-response, so every stalled request failed and was retried, as a dropped one is)."""
    from goodput.testing.faultproxy import FaultProxy
    from tests.helpers.cache_helpers import via

    payload = bytes(range(256)) * 400
    fsspec.filesystem("s3", skip_instance_cache=True, **s3_server.storage_options()).pipe(
        f"{s3_url}/c.bin", payload
    )
    proxy = FaultProxy(s3_server.s3_port)
    proxy.start()
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **via(s3_server, proxy.endpoint_url))
        proxy.stall_next(2, 0.2, match="c.bin")  # the client's HEAD, then its GET
        assert fs.cat_file(f"{s3_url}/c.bin") == payload
    finally:
        proxy.stop()
    reads = [(r.method, r.status, r.fault) for r in proxy.records() if r.path.endswith("c.bin")]
    assert reads == [("HEAD", 200, "stall"), ("GET", 200, "stall")], reads  # delayed, answered whole, once


@pytest.mark.parametrize("given_folder", [False, True])
def test_a_stopped_server_leaves_no_listener_no_socket_file_and_only_the_data_it_was_given(
    tmp_path: Path, given_folder: bool
) -> None:
    """A server that removes its data is ended at once; one given a folder stops gracefully and keeps it. Either
    way the unix socket files weed makes in /tmp for its ports go with it."""
    folder = tmp_path / "s3"
    folder.mkdir()
    server = S3Server(bucket="stopped", data_dir=str(folder) if given_folder else None)
    server.start()
    sockets = f"/tmp/seaweedfs-*-{server.s3_port}.sock"
    assert glob.glob(sockets), "weed made no socket file for its S3 port"
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.s3_port), timeout=5).close()
    assert glob.glob(sockets) == []
    assert os.path.isdir(os.path.join(server.data_dir, "store")) == given_folder
