"""The numeric guard's rollback and skip are in the ledger file at once, not only after its next flush.

The ledger's thread appends buffered events every flush period; the steps after a rollback take milliseconds,
so a rank ended by torchrun when another rank is killed a step or two later would lose them (the report then
names no skipped window). One process, a poisoned sample, the flush period made longer than the test.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


POISON = int(EpochOrder(seed=0, epoch=0, size=SIZE).at(np.arange(18, 19))[0])  # step 10's first sample


def _run(run_dir: str, **kwargs: Any) -> gp.Run:
    """A run of 16 steps with both tiers and the guard (``kwargs``: more of Run's arguments)."""
    config = gp.CheckpointConfig(
        root=os.path.join(run_dir, "checkpoints"),
        strategy="dcp",
        every=4,
        memory=gp.MemoryTier(every=2, keep=2, folder=os.path.join(run_dir, "ram")),
    )
    numeric = gp.NumericConfig(check_every=4, spike_warmup=4, spike_window=20)
    return gp.Run(
        run_dir,
        total_steps=16,
        checkpoint=config,
        numeric=numeric,
        hang_timeout=None,
        progress=False,
        **kwargs,
    )


def _train(run: gp.Run, stop: Callable[[], bool]) -> None:
    """Train on the poisoned data until ``stop()`` after a step (or the end), then close the run."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = gp.ResumableLoader(Poisoned(POISON), batch_size=BATCH, seed=0, drop_last=True)
    run.restore(model=model, optimizer=opt, loader=loader)
    try:
        for batch in run.batches(loader):
            loss = model(batch).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            run.step_done(loss=loss.item())
            if stop():
                break
    finally:
        run.close()


def test_a_rollback_and_its_skip_are_written_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow = functools.partial(ledger_module.LedgerConfig, flush_seconds=60)  # only explicit flushes write
    monkeypatch.setattr(ledger_module, "LedgerConfig", slow)
    run_dir = str(tmp_path)
    on_disk: list[dict[str, object]] = []

    def skipped() -> bool:  # the guard has just rolled back twice and skipped the window
        on_disk[:] = (
            read_events(run_dir, rank=0) if read_skips(run_dir) else []
        )  # before any flush but its own
        return bool(on_disk)

    _train(_run(run_dir), skipped)
    rollbacks = [(e["from_step"], e["to_step"]) for e in on_disk if e["event"] == "rollback"]
    assert rollbacks == [(10, 8), (10, 8)]
    (skip,) = [e for e in on_disk if e["event"] == "skip"]
    assert (skip["first_position"], skip["end_position"]) == (16, 20) and POISON in skip["indices"]


def test_rollbacks_in_place_are_attempts_with_progress_for_the_crash_loop_count(tmp_path: Path) -> None:
    """Each rollback opens a new attempt in the same process; the next process start must read those attempts'
    progress, not take their numbers for attempts that died before restoring (the demo stopped as a false crash
    loop after its SIGKILL followed two rollbacks)."""
    run_dir = str(tmp_path)
    run = _run(run_dir, crash_loop=2)
    _train(run, lambda: bool(read_skips(run_dir)) and run.step >= 12)  # two rollbacks, then steps past them
    rollbacks = [e for e in read_events(run_dir, rank=0) if e["event"] == "rollback"]
    assert len(rollbacks) == 2 and run.attempt == 2
    _run(run_dir, crash_loop=2).close()  # the next process start: its previous 2 attempts are the rollbacks
