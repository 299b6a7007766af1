"""``Run.batches`` receives the next batch in a background thread when the loader has worker processes: the loop
gets every batch once, in order, the position counts only what the loop got, and a resumed run continues
exactly where the checkpoint says."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

import goodput as gp
from tests import _data

N, B = 40, 4  # 10 steps an epoch


def _receivers() -> int:
    return sum(t.name == "goodput-prefetch" for t in threading.enumerate())


def _train(run_dir: Path, steps: int, seen: list[int], *, ahead: bool | None = None) -> tuple[int, int]:
    """Train to ``steps``; returns (receiving threads seen inside the loop, the loader's consumed samples)."""
    loader = gp.ResumableLoader(_data.Squares(N), batch_size=B, seed=1, num_workers=1)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = gp.Run(str(run_dir), total_steps=steps, progress=False, hang_timeout=None)
    run.restore(model=model, optimizer=opt, loader=loader)
    threads = 0
    for batch in run.batches(loader, ahead=ahead):
        seen.extend(_data.ids(batch))
        threads = max(threads, _receivers())
        model(batch.float()).square().mean().backward()
        opt.step()
        opt.zero_grad()
        run.step_done()
        assert loader.consumed % N == (run.step * B) % N  # handed-out batches only, never the one ahead
    run.close()
    assert _receivers() == 0  # close() stopped the thread
    return threads, loader.consumed


def test_batches_are_received_ahead_and_resume_exactly(tmp_path: Path) -> None:
    seen: list[int] = []
    threads, _ = _train(tmp_path / "run", 6, seen)
    assert threads == 1  # a loader with workers is received ahead, in one thread
    _train(tmp_path / "run", 10, seen)  # resumes from the final save at step 6
    assert sorted(seen) == list(range(N))  # one epoch, every sample once


def test_ahead_can_be_turned_off(tmp_path: Path) -> None:
    seen: list[int] = []
    threads, consumed = _train(tmp_path / "run", 3, seen, ahead=False)
    assert threads == 0 and consumed == 3 * B and len(seen) == 3 * B
