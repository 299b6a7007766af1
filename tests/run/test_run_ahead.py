"""``Run.batches`` receives the next batch in a background thread when the loader has worker processes: the loop
gets every batch once, in order, the position counts only what the loop got, and a resumed run continues
exactly where the checkpoint says."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import goodput as gp
from goodput.errors import ConfigError
from tests.helpers import data as _data

N, B = 40, 4  # 10 steps an epoch


def _receivers() -> int:
    return sum(t.name == "goodput-prefetch" for t in threading.enumerate())


def _train(run_dir: Path, steps: int, seen: list[int], *, ahead: bool | None = None) -> tuple[int, int]:
    """Train to ``steps``; returns (receiving threads seen inside the loop, the loader's consumed samples)."""
    loader = gp.ResumableLoader(_data.Squares(N), batch_size=B, seed=1, num_workers=1)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # The toy regression on squares diverges to Inf within an epoch; this test is about receiving ahead, and the
    # numeric guard (which would roll it back and stop it) is off by default.
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


class _Counting:
    """A user's stateful loader (as torchdata's StatefulDataLoader): its position counts the batches its
    iterator yielded, so it cannot tell a batch received ahead from one the loop trained on."""

    def __init__(self, n: int) -> None:
        self.loader = torch.utils.data.DataLoader(_data.Squares(n), batch_size=B, num_workers=1)
        self.yielded = 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        for batch in self.loader:
            self.yielded += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.yielded = state["yielded"]


def _run(run_dir: Path, loader: Any, steps: int) -> gp.Run:
    run = gp.Run(str(run_dir), total_steps=steps, progress=False, hang_timeout=None)
    run.restore(model=torch.nn.Linear(2, 1), loader=loader)
    return run


def test_a_checkpointed_loader_that_is_not_a_resumable_loader_is_not_received_ahead(tmp_path: Path) -> None:
    """Received ahead, such a loader's saved position would count a batch the loop never got (a resume would
    skip it): refused with one line, not a silent sample lost."""
    loader = _Counting(N)
    run = _run(tmp_path / "run", loader, 3)
    with pytest.raises(ConfigError, match=r"_Counting.*ahead=False"):
        next(iter(run.batches(loader, ahead=True)))
    for _ in run.batches(loader):  # without ahead (the default for it) its position is the loop's
        run.step_done()
        assert loader.yielded == run.step
    run.close()


def test_a_plain_dataloader_is_refused_at_restore_and_received_ahead_only_when_asked(tmp_path: Path) -> None:
    """A torch DataLoader has no position: restore(loader=...) says so at once (not at the first save); iterated
    without restore, it gets the receiving thread only with ``ahead=True`` (then every batch once, in order,
    and close() stops the thread)."""
    plain = torch.utils.data.DataLoader(_data.Squares(N), batch_size=B, num_workers=1)
    with pytest.raises(ConfigError, match=r"DataLoader\) has no state_dict\(\)/load_state_dict\(\)"):
        _run(tmp_path / "refused", plain, 3)
    for ahead, expected_threads in ((None, 0), (True, 1)):
        run = _run(tmp_path / f"ahead-{ahead}", None, 5)
        seen: list[int] = []
        threads = 0
        for batch in run.batches(plain, ahead=ahead):
            seen.extend(_data.ids(batch))
            threads = max(threads, _receivers())
            run.step_done()
        run.close()
        assert threads == expected_threads and _receivers() == 0
        assert seen == list(range(5 * B))
