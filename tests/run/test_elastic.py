"""World-size changes under goodput launch: 2 -> 1 -> 2 ranks with SIGKILLs in between, as a user would run it.

The demo training (dropout, worker-side augmentation) is launched three times into the same run folder: on 2
ranks until rank 1 is SIGKILLed, on 1 rank until it is SIGKILLed, and on 2 ranks to the end. Each launch
restores the newest checkpoint saved by the other world size. An asynchronous save still uploading when its
launch is killed is lost, as in any run, so each kill comes after the next save has begun: that save first waits
for the one before it, which is then committed whatever the machine's load. Across the whole run every sample of
the epoch's order is trained exactly once (counting, for each step, the attempt whose result survived), each
step has as many batches as the world that trained it, and the loss continues where it was instead of starting
over.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from goodput.checkpoint.durable.layout import list_checkpoints
from goodput.data import ShardedDataset
from goodput.data.order import EpochOrder
from goodput.demo.train import parse_args
from goodput.demo.verify_train import prepare_data, train
from goodput.ledger import read_events
from tests.helpers.elastic import BATCH, check_one_numbering, effective_steps

pytestmark = pytest.mark.slow

STEPS, EVERY = 18, 3


def _newest_committed(run_dir: str) -> int:
    steps = [
        r.step for r in list_checkpoints(os.path.join(run_dir, "checkpoints")) if r.status == "committed"
    ]
    return max(steps)


@pytest.mark.parametrize("strategy", ["dcp_async", "torch_save"])
def test_two_to_one_to_two_ranks_trains_every_sample_once(strategy: str, tmp_path: os.PathLike[str]) -> None:
    data = prepare_data(str(tmp_path))
    run_dir = os.path.join(tmp_path, "run")
    common = {
        "data": data,
        "steps": STEPS,
        "every": EVERY,
        "strategy": strategy,
        "seed": 0,
        "max_restarts": 0,
    }
    assert train(run_dir, nproc=2, faults="kill@step=8,rank=1", **common) != 0  # type: ignore[arg-type]
    first = _newest_committed(run_dir)  # 3, or 6 if its upload ended before the kill
    assert train(run_dir, nproc=1, faults="kill@step=14,rank=0", **common) != 0  # type: ignore[arg-type]
    second = _newest_committed(run_dir)  # 9, or 12
    assert train(run_dir, nproc=2, faults="", **common) == 0  # type: ignore[arg-type]
    assert first in (3, 6) and second in (9, 12), (first, second)

    restored = [(e["attempt"], e["step"]) for e in read_events(run_dir) if e["event"] == "restore_end"]
    worlds = check_one_numbering(run_dir)  # every rank of a round records the round's attempt number
    assert [step for _, step in restored] == [None, first, second], (
        restored
    )  # each launch resumed the other world's newest save
    assert [worlds[a] for a, _ in restored] == [2, 1, 2]

    steps = effective_steps(run_dir)
    assert sorted(steps) == list(range(1, STEPS + 1))
    trained: list[int] = []
    for step in range(1, STEPS + 1):
        rows = steps[step]
        assert len(rows) == worlds[rows[0]["attempt"]], (step, rows)  # one batch per rank of that world
        trained += [i for r in sorted(rows, key=lambda r: r["rank"]) for i in r["samples"]]
    assert len(trained) == BATCH * (2 * first + 1 * (second - first) + 2 * (STEPS - second))
    assert len(set(trained)) == len(trained)  # no sample twice
    dataset = ShardedDataset(data)
    window = parse_args(["--data", data]).shard_window  # the demo's shard-aware order
    order = EpochOrder(seed=0, epoch=0, size=len(dataset), shard_sizes=dataset.shard_sizes, window=window)
    expected = order.at(np.arange(len(trained)))
    assert set(trained) == set(expected.tolist())  # none skipped: exactly the epoch's first samples

    loss = {s: float.fromhex(min(steps[s], key=lambda r: r["rank"])["draws"][1]) for s in steps}
    start = loss[1]
    for resumed in (first + 1, second + 1):  # each relaunch continues the curve, no jump back
        assert loss[resumed] < start - 0.5, loss
        assert loss[resumed] < loss[resumed - 1] + 0.3, loss
    assert np.mean([loss[s] for s in range(STEPS - 2, STEPS + 1)]) < start - 1.0, loss
