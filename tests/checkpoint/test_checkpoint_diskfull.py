"""A real full disk (a 5 MiB tmpfs) during a save: a clear SaveFailed, training goes on, the previous
checkpoint still restores."""

from __future__ import annotations

import gc
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState, list_checkpoints
from goodput.errors import SaveFailed


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        gc.collect()  # drop memory maps of restored files before unmounting
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)


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


def test_a_failed_async_save_is_reported_by_the_next_save_which_then_proceeds(small_disk: Path) -> None:
    model = torch.nn.Linear(512, 512)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    events: list[str] = []
    manager = CheckpointManager(
        CheckpointConfig(root=str(small_disk), strategy="dcp_async", every=1, keep_last=1),
        TrainingState(model=model, optimizer=opt),
        on_event=lambda name, **fields: events.append(f"{name} {fields['step']}"),
    )
    model(torch.randn(4, 512)).square().mean().backward()
    opt.step()
    manager.save(1)
    manager.save(2)  # does not fit next to step 1: fails in the background
    with pytest.raises(SaveFailed, match="saving step 2 failed"):
        manager.save(3)
    assert "checkpoint_failed 2" in events
    shutil.rmtree(small_disk / "step-1")  # make room, as an operator would
    manager.save(3)  # the next save after the reported failure works again
    assert manager.wait() is not None
    manager.close()
    assert [(r.step, r.status) for r in list_checkpoints(str(small_disk))] == [(3, "committed")]
