"""A sample met again in a later epoch is not trained twice: the demo logs each step's epoch as the loop
received it, and the exactly-once count is per epoch."""

from __future__ import annotations

from pathlib import Path

import torch

import goodput as gp
from goodput.verify.demo import batch_epoch, trained_twice
from tests.helpers import data as _data

N, B, STEPS = 40, 4, 25  # 10 steps an epoch: two and a half epochs


def test_each_step_is_logged_with_its_own_epoch_and_counted_once_per_epoch(tmp_path: Path) -> None:
    loader = gp.ResumableLoader(_data.Squares(N), batch_size=B, seed=1, num_workers=1, drop_last=True)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    run = gp.Run(str(tmp_path / "run"), total_steps=STEPS, progress=False, hang_timeout=None)
    run.restore(model=model, optimizer=opt, loader=loader)
    steps: dict[int, list[int]] = {}
    epochs: dict[int, int] = {}
    for batch in run.batches(loader):  # a loader with workers is received ahead, in a thread
        steps[run.step + 1] = list(_data.ids(batch))
        epochs[run.step + 1] = batch_epoch(loader)
        model(batch.float()).square().mean().backward()
        opt.step()
        opt.zero_grad()
        run.step_done()
    run.close()
    assert epochs == {step: (step - 1) // (N // B) for step in range(1, STEPS + 1)}
    assert trained_twice(steps, epochs) == []
    assert len(trained_twice(steps)) == N  # counted without the epochs, the second epoch is all "twice"
    steps[12] = steps[11]  # one batch trained twice inside epoch 1
    assert trained_twice(steps, epochs) == sorted(steps[11])
