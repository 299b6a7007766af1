"""S3 writes whose parts go out while the file is still being written (checkpoint/durable/_part_upload.py), on
the real server (SeaweedFS): parts reach the server before the writer is done, the object appears only whole,
an aborted or failing upload leaves no object, and a failing checkpoint save on S3 leaves the previous one
restorable."""

from __future__ import annotations

import os
from typing import Any

import fsspec
import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState, list_checkpoints
from goodput.checkpoint.durable._part_upload import PartUpload
from goodput.errors import SaveFailed
from goodput.testing import S3Server
from goodput.testing.faultproxy import FaultProxy

MIB = 1 << 20
PART = 5 * MIB  # S3's smallest part


def _fs(options: dict[str, Any]) -> Any:
    return fsspec.filesystem("s3", skip_instance_cache=True, **options)


def _open_uploads(fs: Any, bucket: str, key: str) -> list[dict[str, Any]]:
    answer = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key)
    return [u for u in answer.get("Uploads", []) if u["Key"] == key]


def _write_in_pieces(stream: Any, data: bytes, piece: int) -> None:
    for start in range(0, len(data), piece):
        stream.write(memoryview(data)[start : start + piece])


@pytest.mark.s3
def test_parts_reach_the_server_while_writing_and_the_object_appears_whole(
    s3_server: S3Server, s3_url: str
) -> None:
    fs = _fs(s3_server.storage_options())
    path = f"{s3_url}/big.bin"
    bucket, key = fs.split_path(path)[:2]
    data = os.urandom(3 * PART + 12345)
    upload = PartUpload(fs, path, chunksize=PART, concurrency=1)
    # two full parts and one byte: with one part in flight, sending the second waited for the first
    _write_in_pieces(upload, data[: 2 * PART + 1], 3 * MIB + 7)
    assert upload.tell() == 2 * PART + 1
    (pending,) = _open_uploads(fs, bucket, key)
    parts = fs.call_s3("list_parts", Bucket=bucket, Key=key, UploadId=pending["UploadId"]).get("Parts", [])
    assert [p["PartNumber"] for p in parts][:1] == [1] and parts[0]["Size"] == PART
    assert not fs.exists(path)  # nothing readable before the upload is completed
    _write_in_pieces(upload, data[2 * PART + 1 :], 1 * MIB + 3)
    upload.finish()
    assert _fs(s3_server.storage_options()).cat_file(path) == data
    assert _open_uploads(fs, bucket, key) == []


@pytest.mark.s3
def test_a_file_smaller_than_a_part_is_one_put(s3_server: S3Server, s3_url: str) -> None:
    fs = _fs(s3_server.storage_options())
    path = f"{s3_url}/small.bin"
    data = os.urandom(PART - 1)
    upload = PartUpload(fs, path, chunksize=PART, concurrency=8)
    _write_in_pieces(upload, data, 100_000)
    upload.finish()
    assert _fs(s3_server.storage_options()).cat_file(path) == data
    assert _open_uploads(fs, *fs.split_path(path)[:2]) == []


@pytest.mark.s3
def test_an_aborted_upload_leaves_no_object_and_no_open_upload(s3_server: S3Server, s3_url: str) -> None:
    fs = _fs(s3_server.storage_options())
    path = f"{s3_url}/aborted.bin"
    upload = PartUpload(fs, path, chunksize=PART, concurrency=2)
    _write_in_pieces(upload, os.urandom(3 * PART), 2 * MIB)
    upload.abort()
    assert not fs.exists(path)
    assert _open_uploads(fs, *fs.split_path(path)[:2]) == []


@pytest.mark.s3
def test_a_save_whose_part_upload_fails_keeps_the_previous_checkpoint(
    s3_server: S3Server, s3_url: str
) -> None:
    direct = s3_server.storage_options()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 2048))  # 32 MiB: 2+ parts
    with FaultProxy(s3_server.s3_port) as proxy:
        proxied = {**direct, "client_kwargs": {**direct["client_kwargs"], "endpoint_url": proxy.endpoint_url}}
        config = CheckpointConfig(root=s3_url, strategy="dcp_async", every=1, storage_options=proxied)
        manager = CheckpointManager(config, TrainingState(model=model))
        manager.save(1)
        manager.wait()
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        uploads = [r for r in proxy.records() if r.method == "PUT" and "partNumber=2" in r.path]
        assert uploads, "the 32 MiB rank file went up as a multipart upload"
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        # refused, not retried: the second part of the rank file fails, mid-file
        proxy.fail_next(1, status=403, code="AccessDenied", match="partNumber=2")
        manager.save(2)
        with pytest.raises(SaveFailed):
            manager.wait()
        assert proxy.injected().get("fail") == 1
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        assert manager.restore_latest() == 1
        assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
        manager.close()
    fs = _fs(direct)
    rows = list_checkpoints(s3_url, storage_options={**direct, "skip_instance_cache": True}, checksums=True)
    assert [(r.step, r.status) for r in rows] == [(1, "committed")], rows
    bucket, prefix = fs.split_path(s3_url)[:2]
    assert _open_uploads(fs, bucket, f"{prefix}/step-2/__0_0.distcp") == []


@pytest.mark.s3
def test_never_more_parts_in_flight_than_the_concurrency(s3_server: S3Server, s3_url: str) -> None:
    direct = s3_server.storage_options()
    with FaultProxy(s3_server.s3_port, latency_s=0.05) as proxy:
        proxied = {**direct, "client_kwargs": {**direct["client_kwargs"], "endpoint_url": proxy.endpoint_url}}
        fs = _fs(proxied)
        path = f"{s3_url}/bounded.bin"
        data = os.urandom(6 * PART + 1)
        upload = PartUpload(fs, path, chunksize=PART, concurrency=2)
        _write_in_pieces(upload, data, 4 * MIB)
        upload.finish()
        parts = [r for r in proxy.records() if r.method == "PUT" and "partNumber=" in r.path]
    assert len(parts) == 7
    # the most part uploads open at any one moment, from the proxy's own start/end of each request
    edges = sorted([(r.start, 1) for r in parts] + [(r.end, -1) for r in parts], key=lambda e: (e[0], e[1]))
    open_now = most = 0
    for _, change in edges:
        open_now += change
        most = max(most, open_now)
    assert most <= 2
    assert _fs(direct).cat_file(path) == data
