"""The events the ledger listens to: stall start/end around the blocking part, then durable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState


@pytest.mark.parametrize("strategy", ["torch_save", "dcp", "dcp_async"])
def test_events_and_measured_costs(tmp_path: Path, strategy: str) -> None:
    events: list[tuple[str, dict[str, object]]] = []
    manager = CheckpointManager(
        CheckpointConfig(root=str(tmp_path), strategy=strategy, every=1),
        TrainingState(model=torch.nn.Linear(8, 8)),
        on_event=lambda name, **fields: events.append((name, fields)),
    )
    first = manager.save(5)
    final = manager.wait() or first
    manager.close()
    names = [(name, fields.get("phase")) for name, fields in events]
    assert names == [("checkpoint_stall", "start"), ("checkpoint_stall", "end"), ("checkpoint_durable", None)]
    durable = events[2][1]
    assert durable["step"] == 5 and durable["url"] == str(tmp_path / "step-5")
    assert final.persist_seconds is not None and final.bytes == durable["bytes"]
    assert events[1][1]["seconds"] == final.stall_seconds
    if strategy == "dcp_async":
        assert first.persist_seconds is None  # still in flight when save returned
    else:
        assert final.stall_seconds == final.persist_seconds  # a synchronous save blocks until committed


def test_maybe_save_follows_the_policy(tmp_path: Path) -> None:
    manager = CheckpointManager(
        CheckpointConfig(root=str(tmp_path), strategy="dcp", every=3),
        TrainingState(model=torch.nn.Linear(2, 2)),
    )
    saved = [step for step in range(1, 8) if manager.maybe_save(step) is not None]
    manager.close()
    assert saved == [3, 6]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-3", "step-6"]


def test_at_most_one_async_save_in_flight(tmp_path: Path) -> None:
    events: list[str] = []
    manager = CheckpointManager(
        CheckpointConfig(root=str(tmp_path), strategy="dcp_async", every=1),
        TrainingState(model=torch.nn.Linear(64, 64)),
        on_event=lambda name, **fields: events.append(f"{name}:{fields.get('phase', '')}:{fields['step']}"),
    )
    for step in (1, 2, 3):
        manager.save(step)  # returns after staging; the next call first waits for the previous write
    manager.close()
    # the next save's stall starts at the call (its wait for the previous write is part of it) and ends after
    # the previous one is durable: its own staging never overlaps an upload
    ends = [events.index(f"checkpoint_stall:end:{s}") for s in (2, 3)]
    durables = [events.index(f"checkpoint_durable::{s}") for s in (1, 2)]
    assert all(d < e for d, e in zip(durables, ends, strict=True)), events
