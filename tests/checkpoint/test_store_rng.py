"""Checkpoint I/O to an object store leaves the user's global generators alone, also when the store retries.

botocore jitters each retry's backoff and aiohttp's pool shuffles its waiters with Python's global ``random``,
on fsspec's I/O thread (see ``goodput/_client_random.py``); a script seeded with ``random.seed`` must still draw
the same stream with its checkpoints on S3, whatever the store answered, as with them on local disk.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState
from goodput.testing import S3Server
from goodput.testing.faultproxy import FaultProxy

pytestmark = pytest.mark.s3


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.s3_port) as p:
        yield p


def _states() -> tuple[object, ...]:
    _, key, pos, _, _ = np.random.get_state(legacy=True)
    return random.getstate(), bytes(np.asarray(key).tobytes()), int(pos), torch.get_rng_state().tolist()


@pytest.mark.parametrize("strategy", ["torch_save", "dcp", "dcp_async"])
def test_saves_and_restores_through_a_retrying_store_draw_nothing_from_the_users_generators(
    strategy: str, s3_server: S3Server, s3_url: str, proxy: FaultProxy
) -> None:
    options = s3_server.storage_options()
    options["client_kwargs"] = {**options["client_kwargs"], "endpoint_url": proxy.endpoint_url}
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    expected = random.Random(7)
    model = torch.nn.Linear(8, 4)
    manager = CheckpointManager(
        CheckpointConfig(root=s3_url, strategy=strategy, every=1, keep_last=2, storage_options=options),
        TrainingState(model=model),
    )
    drawn: list[float] = []
    for step in (1, 2):
        saved = _states()
        proxy.fail_next(1, status=503, code="SlowDown")  # the client retries these, with jittered backoff
        manager.save(step)
        drawn += [random.random() for _ in range(200)]  # the user's own draws while an async upload runs
        manager.wait()
        drawn += [random.random() for _ in range(200)]
        assert _states()[1:] == saved[1:], "checkpoint I/O moved numpy's or torch's global generator"
    assert drawn == [expected.random() for _ in drawn], "checkpoint I/O drew from Python's global random"
    random.random()
    proxy.fail_next(1, status=503, code="SlowDown")
    assert manager.restore_latest() == 2
    manager.close()
    assert proxy.injected().get("fail", 0) == 3, "the store's faults did not reach the client"
    assert _states() == saved, "the restore left a generator elsewhere than step 2's save found it"
