"""TrainingState's live form, the one codec of a warm hand-over: a survivor's state, sent as bytes and loaded
by another process's freshly built objects, continues training exactly as the survivor would have."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from goodput.checkpoint import TrainingState
from goodput.checkpoint.transfer import decode, encode
from goodput.data import ResumableLoader
from goodput.errors import CheckpointCorrupt
from tests.helpers.planted import Planted


def _objects(seed: int) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = ResumableLoader(list(range(64)), batch_size=4, seed=7)
    return TrainingState(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)


def _train(state: TrainingState, steps: int, batches: Iterator[Any]) -> list[float]:
    assert state.model is not None and state.optimizer is not None
    losses = []
    for _ in range(steps):
        batch = next(batches)
        x = torch.stack([torch.full((4,), float(v)) for v in batch]) / 64
        loss = state.model(x).pow(2).mean()
        loss.backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
        state.scheduler.step()
        losses.append(float(loss))
    return losses


def test_a_survivor_s_live_state_continues_exactly_in_a_new_process_s_objects() -> None:
    survivor = _objects(seed=0)
    assert survivor.loader is not None
    batches = iter(survivor.loader)  # type: ignore[call-overload]
    _train(survivor, 5, batches)
    survivor.extras["tokens"] = 123
    survivor.samples_seen = 20
    position = survivor.loader.state_dict()
    payload = encode(survivor.live_state_dict(loader=position)).to_bytes()
    expected = _train(survivor, 4, batches)

    fresh = _objects(seed=1)  # other weights: everything must come from the hand-over
    fresh.load_live_state_dict(decode(payload))
    assert fresh.extras == {"tokens": 123} and fresh.samples_seen == 20
    assert _train(fresh, 4, iter(fresh.loader)) == expected  # type: ignore[call-overload]
    assert survivor.holds_full_replica()


def test_a_hand_over_that_would_run_code_is_refused_and_runs_none(tmp_path: Path) -> None:
    state = _objects(seed=0)
    sd = state.live_state_dict(loader=None)
    marker = tmp_path / "ran"
    sd["extra"] = Planted(str(marker))
    buf = io.BytesIO()
    torch.save(sd, buf)  # what a sender other than goodput's could put on the wire
    with pytest.raises(CheckpointCorrupt):
        decode(buf.getvalue())
    assert not marker.exists()
