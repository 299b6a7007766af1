"""A real full disk (a small tmpfs) during a save: a clear SaveFailed, training goes on, the previous
checkpoint still restores; under ``Run`` the failure is one warning and a ledger event, retention never removes
the last valid checkpoint, and the next save after space comes back commits."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import goodput as gp
from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState, list_checkpoints
from goodput.errors import SaveFailed
from goodput.ledger import read_events


def _tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``mount_point`` (skips where mounting is not permitted)."""
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        gc.collect()  # drop memory maps of restored files before unmounting
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from _tmpfs(tmp_path / "disk", "5m")


@pytest.fixture
def two_checkpoint_disk(tmp_path: Path) -> Iterator[Path]:
    """Room for two checkpoints of ``_model()`` and their optimizer state, not three."""
    yield from _tmpfs(tmp_path / "disk", "8m")


@pytest.mark.parametrize("strategy", ["torch_save", "dcp", "dcp_async"])
def test_disk_full_fails_cleanly_and_the_previous_checkpoint_restores(
    small_disk: Path, strategy: str
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)  # with AdamW: ~3 MiB per checkpoint, so the second one cannot fit
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    manager = CheckpointManager(
        CheckpointConfig(root=str(small_disk), strategy=strategy, every=1),
        TrainingState(model=model, optimizer=opt),
    )

    def train() -> None:
        model(torch.randn(4, 512)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    train()
    manager.save(1)
    manager.wait()
    saved = model.weight.detach().clone()
    train()
    with pytest.raises(
        SaveFailed, match=r"saving step 2 failed .*No space left on device.*previous checkpoint is untouched"
    ):
        manager.save(2)
        manager.wait()
    train()  # training goes on
    assert [(r.step, r.status) for r in list_checkpoints(str(small_disk))] == [
        (1, "committed")
    ]  # the failed save is gone
    assert manager.restore_latest() == 1
    assert torch.equal(model.weight, saved)
    manager.close()


def test_a_failed_async_save_is_reported_by_the_next_save_which_saves_all_the_same(
    two_checkpoint_disk: Path,
) -> None:
    """Step 2's save runs out of space in the background; space is back as its failure is reported. The next
    save call raises that failure once and still saves its own step (the old manager raised and saved nothing,
    so one failed save cost the next checkpoint too); step 1 stays valid until step 3 is committed."""
    model = torch.nn.Linear(512, 512)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 512)).square().mean().backward()
    opt.step()
    ballast: list[Path] = []

    def on_event(name: str, **fields: object) -> None:
        if name == "checkpoint_failed":
            ballast.pop().unlink()  # an operator makes room as the failure is reported

    manager = CheckpointManager(
        CheckpointConfig(root=str(two_checkpoint_disk), strategy="dcp_async", every=1, keep_last=1),
        TrainingState(model=model, optimizer=opt),
        on_event=on_event,
    )
    manager.save(1)
    manager.wait()
    ballast.append(_fill(two_checkpoint_disk, leave=1 << 20))
    manager.save(2)  # fails in the background: no room
    with pytest.raises(SaveFailed, match="saving step 2 failed"):
        manager.save(3)
    # step 1 is kept while step 3 is in flight (step 3's partial folder may be listed above it, or step 3 may
    # already be committed, and retention may then have removed step 1)
    committed = [r.step for r in list_checkpoints(str(two_checkpoint_disk)) if r.status == "committed"]
    assert committed in ([1], [3, 1], [3]), committed
    saved = manager.wait()
    assert saved is not None and saved.step == 3
    manager.close()
    assert [(r.step, r.status) for r in list_checkpoints(str(two_checkpoint_disk))] == [(3, "committed")]


def _fill(disk: Path, leave: int) -> Path:
    """A ballast file that leaves ``leave`` bytes free on ``disk`` (an operator's other data)."""
    ballast = disk / "ballast"
    stat = os.statvfs(disk)
    ballast.write_bytes(bytes(max(0, stat.f_bavail * stat.f_frsize - leave)))
    return ballast


def test_a_run_trains_on_through_a_full_disk_and_saves_again_once_there_is_room(
    two_checkpoint_disk: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)  # ~3 MiB a checkpoint with AdamW's moments
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    config = gp.CheckpointConfig(root=str(two_checkpoint_disk), strategy="dcp", every=2, keep_last=1)
    run = gp.Run(str(tmp_path / "run"), checkpoint=config, total_steps=8, progress=False, hang_timeout=None)
    run.restore(model=model, optimizer=opt)
    committed = []
    with caplog.at_level(logging.WARNING):
        for step in range(1, 9):
            model(torch.randn(4, 512)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            if step == 3:
                ballast = _fill(two_checkpoint_disk, leave=1 << 20)  # step 4's save runs out mid-way
            if step == 5:
                ballast.unlink()  # room again
            run.step_done(loss=0.0)  # saves at even steps; a failed save raises nothing here
            committed.append(sorted(r.step for r in list_checkpoints(str(two_checkpoint_disk))))
        run.close()
    assert committed[3:5] == [[2], [2]]  # step 4 failed; retention kept step 2, the last valid one
    assert committed[5][-1] == 6  # space came back: step 6 committed (and retention then removed step 2)
    assert [(r.step, r.status) for r in list_checkpoints(str(two_checkpoint_disk))] == [(8, "committed")]
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("goodput")
    ]
    assert len(warnings) == 1 and "saving step 4 failed" in warnings[0], warnings
    failed = [e for e in read_events(str(tmp_path / "run"), rank=None) if e["event"] == "checkpoint_failed"]
    assert [e["step"] for e in failed] == [4]
