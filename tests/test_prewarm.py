"""DCP stays off a new process's way to its first step, and is loaded (in the background) before a save needs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState

# What a worker imports before its first step: the demo's training script's modules and goodput's Run.
_PROBE = """
import sys
import goodput.checkpoint, goodput.run, goodput.data, goodput.demo.train
from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState
import torch
model = torch.nn.Linear(2, 2)
manager = CheckpointManager(CheckpointConfig(root=sys.argv[1], strategy="dcp_async"), TrainingState(model=model))
before = sorted(m for m in sys.modules if m.startswith(("torch.distributed.checkpoint", "sympy")))
manager.close()
after_close = sorted(m for m in sys.modules if m.startswith("torch.distributed.checkpoint"))
print(len(before), len(after_close))
"""


def test_no_dcp_import_before_the_first_step(tmp_path: Path) -> None:
    """Importing goodput's parts and opening a manager import neither DCP nor sympy; closing an unused one
    neither (a fresh interpreter, so this test's own imports do not count)."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path / "ckpt")], check=True, capture_output=True, text=True
    )
    assert out.stdout.split() == ["0", "0"], out.stdout + out.stderr


_SAVE = """
import sys, threading
from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
manager = CheckpointManager(CheckpointConfig(root=sys.argv[1], strategy="dcp_async", every=1),
                            TrainingState(model=model, optimizer=opt))
assert manager.restore_latest() is None
assert "torch.distributed.checkpoint" not in sys.modules
manager.should_save(1)  # the first step's decision starts the background import
names = [t.name for t in threading.enumerate()]
manager.save(1)
manager.close()
print("goodput-prewarm" in names or "torch.distributed.checkpoint" in sys.modules, manager.results[-1].step)
"""


def test_first_save_after_the_prewarm_writes_a_checkpoint_that_restores(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    out = subprocess.run([sys.executable, "-c", _SAVE, str(root)], check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["True", "1"], out.stdout + out.stderr
    torch.manual_seed(0)
    saved = torch.nn.Linear(4, 4)  # the same seed: the values the subprocess saved
    fresh = torch.nn.Linear(4, 4)
    with torch.no_grad():
        fresh.weight.zero_()
        fresh.bias.zero_()
    opt = torch.optim.SGD(fresh.parameters(), lr=0.1)
    manager = CheckpointManager(
        CheckpointConfig(root=str(root), strategy="dcp_async"), TrainingState(model=fresh, optimizer=opt)
    )
    assert manager.restore_latest() == 1
    manager.close()
    assert torch.equal(fresh.weight, saved.weight) and torch.equal(fresh.bias, saved.bias)
