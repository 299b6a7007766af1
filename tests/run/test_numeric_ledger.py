"""The numeric guard's rollback and skip are in the ledger file at once, not only after its next flush.

The ledger's thread appends buffered events every flush period; the steps after a rollback take milliseconds,
so a rank ended by torchrun when another rank is killed a step or two later would lose them (the report then
names no skipped window). One process, a poisoned sample, the flush period made longer than the test.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import goodput as gp
from goodput.data.order import EpochOrder
from goodput.ledger import ledger as ledger_module
from goodput.ledger.ledger import read_events
from goodput.run.numeric import read_skips

SIZE, BATCH = 64, 2


class Poisoned(torch.utils.data.Dataset[torch.Tensor]):
    def __init__(self, poison: int) -> None:
        self.poison = poison

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        row = torch.arange(4, dtype=torch.float32) / 4 + index / SIZE
        return torch.full((4,), float("nan")) if index == self.poison else row


def test_a_rollback_and_its_skip_are_written_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow = functools.partial(ledger_module.LedgerConfig, flush_seconds=60)  # only explicit flushes write
    monkeypatch.setattr(ledger_module, "LedgerConfig", slow)
    run_dir = str(tmp_path)
    poison = int(EpochOrder(seed=0, epoch=0, size=SIZE).at(np.arange(18, 19))[0])  # step 10's first sample
    config = gp.CheckpointConfig(
        root=os.path.join(run_dir, "checkpoints"),
        strategy="dcp",
        every=4,
        memory=gp.MemoryTier(every=2, keep=2, folder=os.path.join(run_dir, "ram")),
    )
    numeric = gp.NumericConfig(check_every=4, spike_warmup=4, spike_window=20)
    run = gp.Run(
        run_dir, total_steps=16, checkpoint=config, numeric=numeric, hang_timeout=None, progress=False
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = gp.ResumableLoader(Poisoned(poison), batch_size=BATCH, seed=0, drop_last=True)
    run.restore(model=model, optimizer=opt, loader=loader)
    on_disk: list[dict[str, object]] = []
    try:
        for batch in run.batches(loader):
            loss = model(batch).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            run.step_done(loss=loss.item())
            if read_skips(run_dir):  # the guard has just rolled back twice and skipped the window
                on_disk = read_events(run_dir, rank=0)  # before any flush but the guard's own
                break
    finally:
        run.close()
    rollbacks = [(e["from_step"], e["to_step"]) for e in on_disk if e["event"] == "rollback"]
    assert rollbacks == [(10, 8), (10, 8)]
    (skip,) = [e for e in on_disk if e["event"] == "skip"]
    assert (skip["first_position"], skip["end_position"]) == (16, 20) and poison in skip["indices"]
