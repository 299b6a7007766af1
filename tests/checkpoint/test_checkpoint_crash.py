"""Real processes killed with SIGKILL mid-save leave the previous checkpoint as the one restored; retention
keeps what it promises while saves and crashes interleave."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState, list_checkpoints
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.slow

REPO = ROOT


class Child:
    """The crash-test training process, read line by line."""

    def __init__(
        self, root: Path, strategy: str, width: int, last: int, keep_last: int = 2, keep_every: int = 0
    ):
        args = [str(root), strategy, str(width), str(last), str(keep_last), str(keep_every)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.ckpt_child", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        self.lines: list[str] = []

    def read_until(self, wanted: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            if line.startswith(wanted):
                return line.strip()
        raise AssertionError(f"the child ended before printing {wanted!r}; it printed {self.lines[-5:]}")

    def kill(self) -> None:
        """SIGKILL the child, then read what it printed before it died (a save's wait for the one in flight is
        inside its stall, so the previous save's ``checkpoint_durable`` can follow the next ``stall start``)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        assert self.proc.stdout is not None
        self.lines += [line.strip() for line in self.proc.stdout]

    def finish(self) -> None:
        assert self.proc.stdout is not None
        self.lines += [line.strip() for line in self.proc.stdout]
        assert self.proc.wait(timeout=120) == 0, self.lines[-5:]

    def durable(self) -> dict[int, str]:
        """Step -> weight sum (as it was when the save began) of every save the child reported durable."""
        rows = [line.split() for line in self.lines]
        at_start = {int(p[2]): p[3] for p in rows if p[:2] == ["checkpoint_stall", "start"]}
        return {int(p[2]): at_start[int(p[2])] for p in rows if p[0] == "checkpoint_durable"}


def _wait_for_bytes_in_partial(root: Path, step: int, timeout: float = 60.0) -> None:
    """Return as soon as the save of ``step`` has written data bytes into its uncommitted folder."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for folder in root.glob(f"step-{step}.partial-*"):
            if any(f.stat().st_size > 0 for f in folder.iterdir() if f.suffix in (".pt", ".distcp")):
                return
        time.sleep(0.001)
    raise AssertionError(f"the save of step {step} wrote nothing within {timeout}s")


def _restore_here(root: Path, width: int) -> tuple[int | None, str]:
    torch.manual_seed(123)
    model = torch.nn.Linear(width, width)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    manager = CheckpointManager(
        CheckpointConfig(root=str(root), strategy="dcp", every=1), TrainingState(model=model, optimizer=opt)
    )
    step = manager.restore_latest()
    manager.close()
    return step, repr(float(sum(p.detach().double().sum() for p in model.parameters())))


@pytest.mark.parametrize("strategy", ["torch_save", "dcp", "dcp_async"])
def test_sigkill_mid_save_restores_the_previous_checkpoint(tmp_path: Path, strategy: str) -> None:
    width = 2048  # 4M parameters + AdamW: ~50 MB, so the save of step 2 is still being written when killed
    child = Child(tmp_path, strategy, width, last=3)
    child.read_until("checkpoint_stall start 2")
    _wait_for_bytes_in_partial(tmp_path, 2)
    child.kill()
    saved = child.durable()
    assert list(saved) == [1], f"the kill did not land inside the save of step 2: {child.lines}"
    rows = list_checkpoints(str(tmp_path))
    assert [(r.step, r.status) for r in rows if r.status == "committed"] == [(1, "committed")]
    assert any(r.step == 2 and r.status == "partial" for r in rows), rows
    step, weights = _restore_here(tmp_path, width)
    assert step == 1 and weights == saved[1]
    assert [r.status for r in list_checkpoints(str(tmp_path))] == [
        "committed"
    ]  # the dead save's folder is cleaned


def test_retention_holds_while_saves_and_crashes_interleave(tmp_path: Path) -> None:
    rng = random.Random(7)
    last, keep_last, keep_every = 24, 2, 5
    newest = 0
    for _round in range(3):
        child = Child(tmp_path, "dcp_async", 16, last, keep_last, keep_every)
        restored = int(child.read_until("restored").split()[1].replace("None", "0"))
        assert restored >= newest  # never loses the newest committed checkpoint
        target = min(last - 1, restored + rng.randint(2, 6))
        child.read_until(f"checkpoint_durable - {target} ")
        child.kill()
        newest = max(child.durable())
        committed = [r.step for r in list_checkpoints(str(tmp_path)) if r.status == "committed"]
        assert newest in committed
        assert max(committed) == newest
    child = Child(tmp_path, "dcp_async", 16, last, keep_last, keep_every)
    child.finish()
    rows = list_checkpoints(str(tmp_path))
    assert sorted(r.step for r in rows if r.status == "committed") == [5, 10, 15, 20, 23, 24]
    assert {r.status for r in rows} == {"committed"}
