"""A throttling or flaky object store (the real S3 server behind the fault proxy) during saves and restores: 503
SlowDown and 500 bursts, reset connections and stalled requests are retried with backoff by the store's client,
every save commits and restores whole, and no partial checkpoint is ever listed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState, list_checkpoints
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
