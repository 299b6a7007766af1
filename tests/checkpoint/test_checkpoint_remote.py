"""Round trips through fsspec URLs: memory:// in one process, and a real S3 server (SeaweedFS) with 2 ranks."""

from __future__ import annotations

import json
import logging

import fsspec
import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState, list_checkpoints
from goodput.checkpoint.durable.layout import MANIFEST_NAME
from goodput.testing import S3Server, run_ranks
from tests.checkpoint.test_checkpoint_roundtrip import check_roundtrip
from tests.helpers import ckpt_ranks as _ckpt_ranks


@pytest.mark.parametrize("strategy", ["torch_save", "dcp", "dcp_async"])
def test_memory_url_roundtrip(strategy: str) -> None:
    root = f"memory://goodput-test/{strategy}"
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    manager = CheckpointManager(
        CheckpointConfig(root=root, strategy=strategy, every=1, keep_last=1),
        TrainingState(model=model, optimizer=opt),
    )
    for step in (1, 2):
        model(torch.randn(2, 6)).sum().backward()
        opt.step()
        manager.save(step)
    manager.wait()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    assert manager.restore_latest() == 2
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    manager.close()
    assert [(r.step, r.status) for r in list_checkpoints(root, checksums=True)] == [(2, "committed")]
    fsspec.filesystem("memory").rm(root, recursive=True)


@pytest.mark.slow
@pytest.mark.s3
def test_s3_two_rank_roundtrip_and_every_object_is_flushed(s3_server: S3Server, s3_url: str) -> None:
    options = s3_server.storage_options()
    cases = [("dcp_async", "ddp"), ("dcp", "fsdp"), ("torch_save", "ddp")]
    by_rank = run_ranks(_ckpt_ranks.roundtrip_cases, 2, s3_url, cases, options)
    for strategy, wrap in cases:
        name = f"{strategy}-{wrap}"
        check_roundtrip([by_rank[0][name], by_rank[1][name]])
        # A client that shares no cache with the writers sees every object in full: sizes and sha256 verify.
        fresh = {**options, "skip_instance_cache": True}
        rows = list_checkpoints(f"{s3_url}/{name}", storage_options=fresh, checksums=True)
        assert [(r.step, r.status) for r in rows] == [(4, "committed"), (2, "committed")], rows


@pytest.mark.s3
def test_s3_uncommitted_folder_is_partial_and_skipped(s3_server: S3Server, s3_url: str) -> None:
    options = s3_server.storage_options()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    manager = CheckpointManager(
        CheckpointConfig(root=s3_url, strategy="dcp", every=1, storage_options=options),
        TrainingState(model=model),
    )
    manager.save(1)
    manager.save(2)
    fs = fsspec.filesystem("s3", **options)
    fs.rm(f"{s3_url}/step-2/{MANIFEST_NAME}")  # as if the writer died before the marker
    assert [(r.step, r.status) for r in list_checkpoints(s3_url, storage_options=options)] == [
        (2, "partial"),
        (1, "committed"),
    ]
    assert manager.restore_latest() == 1
    manager.close()


@pytest.mark.s3
def test_goodput_ls_on_an_s3_url_with_credentials_from_the_environment(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from goodput.cli import main

    manager = CheckpointManager(
        CheckpointConfig(root=s3_url, strategy="dcp", every=1, storage_options=s3_server.storage_options()),
        TrainingState(model=torch.nn.Linear(4, 2)),
    )
    manager.save(3)
    manager.close()
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    assert main(["ls", s3_url, "--json"]) == 0
    out = capsys.readouterr().out
    rows = json.loads(out)["checkpoints"]
    assert [(r["step"], r["status"], r["strategy"]) for r in rows] == [(3, "committed", "dcp")]
    assert s3_server.secret_key not in out


@pytest.mark.s3
def test_s3_retention_leaves_nothing_to_warn_about(
    s3_server: S3Server, s3_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # SeaweedFS keeps a removed step's folder as an empty marker object; the next manager's cleanup must not
    # take it for a folder someone else wrote
    options = s3_server.storage_options()
    state = TrainingState(model=torch.nn.Linear(8, 8))
    config = CheckpointConfig(root=s3_url, strategy="dcp", keep_last=1, storage_options=options)
    manager = CheckpointManager(config, state)
    for step in (1, 2, 3):
        manager.save(step)
        manager.wait()
    manager.close()
    with caplog.at_level(logging.WARNING, logger="goodput.checkpoint.durable.layout"):
        CheckpointManager(config, state).close()
    assert not [r.getMessage() for r in caplog.records if "alone" in r.getMessage()]
    assert [(r.step, r.status) for r in list_checkpoints(s3_url, storage_options=options)][:1] == [
        (3, "committed")
    ]


@pytest.mark.s3
def test_goodput_ls_on_s3_does_not_list_an_emptied_step_folder(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from goodput.cli import main

    options = s3_server.storage_options()
    config = CheckpointConfig(root=s3_url, strategy="dcp", keep_last=1, storage_options=options)
    manager = CheckpointManager(config, TrainingState(model=torch.nn.Linear(4, 2)))
    for step in (1, 2):
        manager.save(step)
        manager.wait()
    manager.close()
    fs = fsspec.filesystem("s3", **options)
    fs.invalidate_cache()
    prefix = s3_url.removeprefix("s3://")
    left = [str(p).rstrip("/") for p in fs.ls(f"{prefix}/step-1", detail=False)]
    assert left in ([], [f"{prefix}/step-1"])  # no object left in it but, perhaps, its own folder marker
    # the server keeps the emptied folder, so a listing of the root still names it
    assert f"{prefix}/step-1" in [str(p).rstrip("/") for p in fs.ls(prefix, detail=False)]
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    assert main(["ls", s3_url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["checkpoints"]
    assert [(r["step"], r["status"]) for r in rows] == [(2, "committed")]
    assert [(r.step, r.status) for r in list_checkpoints(s3_url, storage_options=options)] == [
        (2, "committed")
    ]
