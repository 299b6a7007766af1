"""The checkpoint manager over its tiers: each tier stands alone behind the protocol (save, restore at least a
step, wait, close), the manager asks the fastest first, and a faster tier never restores a step older than the
newest durable one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, MemoryTier, TrainingState
from goodput.checkpoint._collectives import Collectives
from goodput.checkpoint.durable import DurableTier
from goodput.checkpoint.layout import CheckpointLayout
from goodput.checkpoint.policy import EverySteps


def _state(seed: int) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return TrainingState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def _weights(state: TrainingState) -> torch.Tensor:
    assert state.model is not None
    return torch.cat([p.detach().flatten().clone() for p in state.model.parameters()])


def test_the_durable_tier_saves_and_restores_on_its_own(tmp_path: Path) -> None:
    config = CheckpointConfig(root=str(tmp_path / "ck"), every=1, strategy="dcp")

    def tier(state: TrainingState) -> DurableTier:
        layout = CheckpointLayout(config.root, config.storage_options)
        return DurableTier(
            config, state, layout, Collectives(), policy=EverySteps(1), token="t", emit=lambda *a, **k: None,
            clock=time.monotonic,
        )  # fmt: skip

    saved = _state(0)
    writer = tier(saved)
    writer.save(3)
    writer.wait()
    writer.close(finished=True)
    loaded = _state(1)
    reader = tier(loaded)
    assert reader.find() == 3
    found = reader.restore(at_least=3)
    assert found is not None and (found.step, found.tier) == (3, "durable")
    assert torch.equal(_weights(loaded), _weights(saved))
    assert reader.restore(at_least=4) is None  # nothing as new as that
    reader.close(finished=True)


def test_a_faster_tier_restores_no_step_older_than_the_newest_durable_one(tmp_path: Path) -> None:
    config = CheckpointConfig(
        root=str(tmp_path / "ck"), every=100, memory=MemoryTier(every=100, folder=str(tmp_path / "shm"))
    )
    state = _state(0)
    first = CheckpointManager(config, state)
    assert [tier.name for tier in first.tiers] == ["memory", "durable"]
    first.save_memory(3)
    first.save(4)
    at_four = _weights(state)
    first.close(finished=False)  # keep the memory folder, as a job that stops to be resumed

    events: list[tuple[str, dict[str, Any]]] = []
    fresh = _state(1)
    second = CheckpointManager(config, fresh, on_event=lambda name, **f: events.append((name, f)))
    assert second.restore_latest() == 4
    restored = [f for name, f in events if name == "checkpoint_restored"]
    assert [(f["step"], f["tier"]) for f in restored] == [(4, "durable")]
    assert torch.equal(_weights(fresh), at_four)
    second.close()
