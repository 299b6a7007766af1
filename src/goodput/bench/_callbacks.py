"""Per-step cost of the Lightning and Hugging Face callbacks, for ``goodput bench ledger``.

Each framework calls the callback's per-step hooks itself; this drives those hooks directly, with the few
trainer fields they read, so the figure is the integration's own cost (ledger events, fault check, save
decision, the data position after each batch), not the framework's. Two parts, each timed directly, since
the difference of two whole training loops drowns a few microseconds in the noise of a shared machine:

* the hooks: every per-step hook call timed on its own (the save policy never fires; a save is a checkpoint
  stall, which the ledger reports as such);
* the tracking wrapper the integrations put around the loader (the position after each batch, the fetch
  wait): iterating an in-memory loader through it, against iterating the same loader bare.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

__all__ = ["callback_overheads"]


class _MemoryLoader:
    """Batches already in memory, with a position like a ResumableLoader's (so only the wrapper costs)."""

    def __init__(self, steps: int) -> None:
        self.batches = list(range(steps))
        self.consumed = 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[int]:
        for batch in self.batches:
            self.consumed += 1
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """One epoch only."""

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": 0, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consumed = int(state["consumed"])


def _iterate(loader: Any) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def _lightning(folder: str, steps: int) -> tuple[float, Any]:
    import torch

    from goodput.checkpoint import CheckpointConfig
    from goodput.integrations.lightning import GoodputCallback

    model = torch.nn.Linear(4, 4)
    config = CheckpointConfig(root=f"{folder}/ckpt", every=10**9)
    callback = GoodputCallback(folder, checkpoint=config, loader=_MemoryLoader(steps))
    trainer = SimpleNamespace(
        global_step=0, max_steps=-1, global_rank=0, world_size=1, lightning_module=model,
        optimizers=[torch.optim.SGD(model.parameters(), lr=0.1)], lr_scheduler_configs=[],
        strategy=SimpleNamespace(checkpoint_io=callback.checkpoint_io, restore_checkpoint_after_setup=True),
    )  # fmt: skip
    callback.setup(trainer, model, "fit")
    callback.on_train_start(trainer, model)
    outputs = {"loss": torch.tensor(0.5)}
    spent = 0.0
    for step in range(1, steps + 1):
        trainer.global_step = step
        start = time.perf_counter()
        callback.on_train_batch_end(trainer, model, outputs, None, step)
        spent += time.perf_counter() - start
    callback.checkpoint_io.teardown()
    callback.ledger.close()
    return spent, callback.loader


def _hf(folder: str, steps: int) -> tuple[float, Any]:
    from goodput.integrations.hf import GoodputTrainerCallback

    callback = GoodputTrainerCallback(folder, loader=_MemoryLoader(steps))
    args = SimpleNamespace(gradient_accumulation_steps=1, save_steps=10**9, output_dir=f"{folder}/out")
    state = SimpleNamespace(global_step=0, max_steps=-1)
    control = SimpleNamespace(should_save=False)
    callback.on_train_begin(args, state, control)
    spent = 0.0
    for step in range(1, steps + 1):
        state.global_step = step
        start = time.perf_counter()
        callback.on_step_end(args, state, control)
        spent += time.perf_counter() - start
    callback.on_train_end(args, state, control)
    return spent, callback.loader


def callback_overheads(steps: int) -> dict[str, dict[str, float] | str]:
    """Per framework: seconds in the hooks, in the loader wrapper, and the total per step (or why skipped)."""
    runs: dict[str, tuple[str, Callable[[str, int], tuple[float, Any]]]] = {
        "lightning": ("lightning", _lightning),
        "hf": ("transformers", _hf),
    }
    out: dict[str, dict[str, float] | str] = {}
    for name, (package, measure) in runs.items():
        if importlib.util.find_spec(package) is None:
            out[name] = f"skipped: needs {package} (pip install 'goodput[{name}]')"
            continue
        with tempfile.TemporaryDirectory(prefix=f"goodput-bench-{name}-") as folder:
            measure(folder, min(steps, 500))  # warm: imports, first events
            hooks, tracked = measure(folder, steps)
        wrapped = min(_iterate(tracked) for _ in range(3))
        bare = min(_iterate(_MemoryLoader(steps)) for _ in range(3))
        wrapper = max(0.0, wrapped - bare)
        out[name] = {
            "hook_seconds": hooks,
            "wrapper_seconds": wrapper,
            "overhead_per_step": (hooks + wrapper) / steps,
        }
    return out
