"""The checkpoint manager over its tiers: each tier stands alone behind the protocol (save, restore at least a
step, wait, close), the manager asks the fastest first, and a faster tier never restores a step older than the
newest durable one. A tier written here, with a cadence of its own, is a tier like the others."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, MemoryTier, TrainingState
from goodput.checkpoint._collectives import Collectives
from goodput.checkpoint.durable import DurableCheckpointer
from goodput.checkpoint.durable.layout import CheckpointLayout
from goodput.checkpoint.policy import EverySteps
from goodput.checkpoint.tier import Cadence, Damage, Restored


def _state(seed: int) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return TrainingState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def _weights(state: TrainingState) -> torch.Tensor:
    assert state.model is not None
    return torch.cat([p.detach().flatten().clone() for p in state.model.parameters()])


def test_the_durable_tier_saves_and_restores_on_its_own(tmp_path: Path) -> None:
    config = CheckpointConfig(root=str(tmp_path / "ck"), every=1, strategy="dcp")

    def tier(state: TrainingState) -> DurableCheckpointer:
        layout = CheckpointLayout(config.root, config.storage_options)
        return DurableCheckpointer(
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
    memory = first.tier("memory")
    assert memory is not None
    memory.save(3)
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


class ScratchTier:
    """Whole states kept in a dict of this process (``saved``, which outlives a manager), every ``every`` steps:
    a third tier, with a cadence of its own."""

    name = "scratch"

    def __init__(self, state: TrainingState, saved: dict[int, dict[str, Any]], every: int) -> None:
        self.state, self.saved = state, saved
        self.cadence = Cadence(EverySteps(every))
        self.committed: list[int] = sorted(saved, reverse=True)

    def save(self, step: int) -> None:
        self.cadence.policy.saved(step, 0.0)
        self.saved[step] = copy.deepcopy(self.state.state_dict())
        self.committed = sorted(self.saved, reverse=True)

    def charge(self, step: int, seconds: float) -> None:
        pass

    def busy(self) -> bool:
        return False

    def wait(self) -> None:
        pass

    def find(self, *, at_most: int | None = None) -> int | None:
        self.committed = [s for s in self.committed if at_most is None or s <= at_most]
        return self.committed[0] if self.committed else None

    def restore(self, *, at_least: int | None = None) -> Restored | None:
        if not self.committed or (at_least is not None and self.committed[0] < at_least):
            return None
        self.state.load_state_dict(copy.deepcopy(self.saved[self.committed[0]]))
        return Restored(self.committed[0], "scratch", "scratch")

    def damage(self) -> Damage:
        return Damage()

    def pin(self, step: int) -> None:
        pass

    def own_groups(self) -> list[Any]:
        return []

    def drop_groups(self) -> None:
        pass

    def close(self, *, finished: bool) -> None:
        pass


def _train(manager: CheckpointManager, state: TrainingState, steps: range) -> dict[int, torch.Tensor]:
    weights = {}
    for step in steps:
        with torch.no_grad():
            for p in state.model.parameters():  # type: ignore[union-attr]
                p.add_(0.5)
        weights[step] = _weights(state)
        manager.maybe_save(step)
    return weights


def test_a_third_tier_saves_by_its_own_cadence_and_restores_first_when_newest(tmp_path: Path) -> None:
    config = CheckpointConfig(root=str(tmp_path / "ck"), every=5, strategy="dcp")
    saved: dict[int, dict[str, Any]] = {}
    state = _state(0)
    first = CheckpointManager(config, state, tiers=[ScratchTier(state, saved, every=3)])
    assert [tier.name for tier in first.tiers] == ["scratch", "durable"]
    weights = _train(first, state, range(1, 13))
    first.close(finished=False)
    # its own steps, and the durable tier's too (a faster tier saves whenever a slower one does)
    assert sorted(saved) == [3, 5, 6, 9, 10, 12]
    assert first.committed == [10, 5]

    events: list[tuple[str, dict[str, Any]]] = []
    fresh = _state(1)
    second = CheckpointManager(
        config,
        fresh,
        on_event=lambda name, **f: events.append((name, f)),
        tiers=[ScratchTier(fresh, saved, 3)],
    )
    assert second.restore_latest() == 12  # newer than the durable step 10: the fast tier's
    assert [(f["step"], f["tier"]) for name, f in events if name == "checkpoint_restored"] == [
        (12, "scratch")
    ]
    assert torch.equal(_weights(fresh), weights[12])
    second.close(finished=False)

    older = {3: saved[3]}  # this tier holds only a step older than the newest durable one
    third_state = _state(2)
    third = CheckpointManager(config, third_state, tiers=[ScratchTier(third_state, older, 3)])
    assert third.restore_latest() == 10
    assert torch.equal(_weights(third_state), weights[10])
    third.close()
