"""A throttling or flaky object store (the real S3 server behind the fault proxy) during saves and restores: 503
SlowDown and 500 bursts, reset connections and stalled requests are retried with backoff by the store's client,
every save commits and restores whole, and no partial checkpoint is ever listed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState, list_checkpoints
from goodput.errors import SaveFailed
from goodput.testing import S3Server
from goodput.testing.faultproxy import FaultProxy

pytestmark = pytest.mark.s3


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.s3_port) as p:
        yield p


def _through(server: S3Server, proxy: FaultProxy, **config: Any) -> dict[str, Any]:
    options = server.storage_options()
    options["client_kwargs"] = {**options["client_kwargs"], "endpoint_url": proxy.endpoint_url}
    if config:
        options["config_kwargs"] = config
    return options


def _listed(server: S3Server, url: str) -> list[tuple[int, str]]:
    options = {**server.storage_options(), "skip_instance_cache": True}
    return sorted((r.step, r.status) for r in list_checkpoints(url, storage_options=options))


def _writes(method: str, path: str) -> bool:
    """What a full store refuses: uploads and multipart requests, not a multi-object delete (POST ?delete)."""
    return method == "PUT" or (method == "POST" and "?delete" not in path)


def _inject(proxy: FaultProxy, kind: str) -> None:
    if kind == "throttled":
        # two in a row (503 here, 500 below), so a request is retried and its retry fails again; each further
        # one only adds to the client's exponential backoff (a random wait of up to 2**n s), not to what is proved
        proxy.fail_next(2, status=503, code="SlowDown")
    elif kind == "5xx":
        proxy.fail_next(2, status=500, code="InternalError")
    elif kind == "reset":
        proxy.drop_next(2)
    else:
        proxy.stall_next(2, 3.0)  # past the client's 1 s read timeout: the request is abandoned and retried


@pytest.mark.parametrize("kind", ["throttled", "5xx", "reset", "stalled"])
def test_saves_and_restores_ride_out_a_flaky_store(
    s3_server: S3Server, s3_url: str, proxy: FaultProxy, kind: str
) -> None:
    strategy = "dcp_async"
    options = _through(s3_server, proxy, connect_timeout=1.0, read_timeout=1.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    manager = CheckpointManager(
        CheckpointConfig(root=s3_url, strategy=strategy, every=1, storage_options=options),
        TrainingState(model=model),
    )
    saved = {}
    for step in (1, 2):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
        _inject(proxy, kind)
        manager.save(step)
        assert manager.wait() is not None
        assert _listed(s3_server, s3_url)[-1] == (step, "committed")
    injected_by_saves = sum(proxy.injected().values())
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    _inject(proxy, kind)
    assert manager.restore_latest() == 2
    assert all(torch.equal(saved[2][k], v) for k, v in model.state_dict().items())
    manager.close()
    assert injected_by_saves >= 2 and sum(proxy.injected().values()) > injected_by_saves  # faults did fire
    assert _listed(s3_server, s3_url) == [(1, "committed"), (2, "committed")]


def test_a_restore_reads_each_listed_checkpoints_manifest_once_and_no_data_file_it_does_not_load(
    s3_server: S3Server, s3_url: str, proxy: FaultProxy
) -> None:
    """Every request to an object store costs a round trip (tens of ms on a cloud store), and a restore lists
    every kept checkpoint: a checkpoint's status comes from its manifest and its folder's listing (which holds
    every file's size), so its manifest is read once and no file of it is asked about one by one; only the
    checkpoint restored is read further (verified, then loaded)."""
    model = torch.nn.Linear(64, 64)
    manager = CheckpointManager(
        CheckpointConfig(
            root=s3_url, strategy="dcp", every=1, keep_last=3, storage_options=_through(s3_server, proxy)
        ),
        TrainingState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)),
    )
    for step in (1, 2, 3):
        manager.save(step)
    manager.wait()
    before = len(proxy.records())
    assert manager.restore_latest() == 3
    requests = [(r.method, r.path) for r in proxy.records()[before:]]
    for step in (1, 2):  # listed, not restored
        ours = [(method, path) for method, path in requests if f"/step-{step}/" in path]
        assert [m for m, p in ours if p.endswith("goodput-manifest.json") and m == "GET"] == ["GET"], ours
        assert not [p for _, p in ours if not p.endswith("goodput-manifest.json")], ours
    manager.close()


def test_a_store_full_when_an_attempt_starts_lets_it_restore_and_train_and_save_again_once_it_has_room(
    s3_server: S3Server, s3_url: str, proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    # a restart while the store is full: opening the manager must not fail on the store's probe write (every
    # restart would then crash in turn until there is room); its saves fail, and commit once there is room
    options = _through(s3_server, proxy)
    model = torch.nn.Linear(64, 64)
    config = CheckpointConfig(root=s3_url, strategy="dcp", every=1, storage_options=options)
    first = CheckpointManager(config, TrainingState(model=model))
    first.save(1)
    first.wait()
    first.close()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    proxy.fail_next(1 << 30, status=507, code="InsufficientStorage", match=_writes)
    manager = CheckpointManager(config, TrainingState(model=model))
    assert "refused a probe write" in caplog.text and "InsufficientStorage" in caplog.text
    with torch.no_grad():
        model.weight.zero_()
    assert manager.restore_latest() == 1
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    with pytest.raises(SaveFailed, match="InsufficientStorage"):
        manager.save(2)
        manager.wait()
    assert _listed(s3_server, s3_url) == [(1, "committed")]  # the failed save left the last good one
    proxy.clear_faults()  # room again
    manager.save(3)
    manager.wait()
    manager.close()
    assert _listed(s3_server, s3_url)[-1] == (3, "committed")
