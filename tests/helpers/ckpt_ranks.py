"""Module-level functions for checkpoint tests: spawned ranks and child processes must be able to import them."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState


class CountingLoader:
    """A stand-in data position: JSON state, advances by a per-rank stride."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.position = 0

    def advance(self) -> None:
        self.position += self.rank + 1

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "rank": self.rank}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["rank"] != self.rank:
            raise ValueError(f"rank {self.rank} was given rank {state['rank']}'s data position")
        self.position = int(state["position"])


class Job:
    """A tiny model, optimizer, scheduler and loader whose every step draws from every RNG."""

    def __init__(
        self, rank: int, *, width: int = 8, wrap: str = "ddp", seed: int = 0, optim: str = "adamw"
    ) -> None:
        torch.manual_seed(seed)  # the same initial weights on every rank
        model: torch.nn.Module = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 4)
        )
        if wrap == "ddp" and dist.is_initialized():
            model = torch.nn.parallel.DistributedDataParallel(model)
        elif wrap == "fsdp" and dist.is_initialized():
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
        self.model = model
        self.width = width
        if optim == "sgd":  # keeps no tensor per parameter
            self.opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        else:
            self.opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)
        self.loader = CountingLoader(rank)
        self.state = TrainingState(
            model=model, optimizer=self.opt, scheduler=self.sched, loader=self.loader, extras={"note": "x"}
        )
        torch.manual_seed(1000 + rank)  # per-rank random streams from here on
        random.seed(2000 + rank)
        np.random.seed(3000 + rank)

    def step(self) -> None:
        x = torch.randn(4, self.width) * (1.0 + random.random()) + float(np.random.rand())
        self.model(x).square().mean().backward()
        self.opt.step()
        self.opt.zero_grad()
        self.sched.step()
        self.loader.advance()

    def snapshot(self) -> dict[str, Any]:
        """Everything that must come back bitwise, as full tensors and plain values."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        msd, osd = get_state_dict(self.model, self.opt, options=StateDictOptions(full_state_dict=True))
        return {
            "model": {k: v.detach().clone() for k, v in msd.items()},
            "optim": {
                f"{p}.{k}": v.clone()
                for p, s in osd["state"].items()
                for k, v in s.items()
                if torch.is_tensor(v)
            },
            "sched": self.sched.state_dict(),
            "loader": self.loader.state_dict(),
        }


def next_draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def same(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Names of the entries that differ (tensors compared bitwise)."""
    diffs = []
    for part in ("model", "optim"):
        for key in a[part]:
            if not torch.equal(a[part][key], b[part][key]):
                diffs.append(f"{part}.{key}")
    for part in ("sched", "loader"):
        if a[part] != b[part]:
            diffs.append(part)
    return diffs


def roundtrip(
    rank: int, world: int, root: str, strategy: str, wrap: str, storage: dict[str, Any]
) -> dict[str, Any]:
    """Train, save at steps 2 and 4, snapshot, train on, restore, and compare with the snapshot. ``wrap``:
    ``ddp`` or ``fsdp``, ``+sgd`` after it for an optimizer without tensors."""
    wrap, _, optim = wrap.partition("+")
    job = Job(rank, wrap=wrap, optim=optim or "adamw")
    config = CheckpointConfig(root=root, strategy=strategy, every=2, keep_last=2, storage_options=storage)
    manager = CheckpointManager(config, job.state)
    for step in range(1, 5):
        job.step()
        if manager.should_save(step):
            manager.save(step)
    manager.wait()
    before = job.snapshot()
    expected = next_draws()
    for _ in range(3):
        job.step()
    job.state.extras = {}
    restored = manager.restore_latest()
    after = job.snapshot()
    draws = next_draws()
    manager.close()
    return {
        "restored": restored,
        "step": job.state.step,
        "diffs": same(before, after),
        "draws_equal": draws == expected,
        "draws": draws,
        "loader": job.loader.state_dict(),
        "extras": job.state.extras,
        "stalls": [r.stall_seconds for r in manager.results],
    }


def roundtrip_cases(
    rank: int, world: int, root: str, cases: list[tuple[str, str]], storage: dict[str, Any]
) -> dict[str, Any]:
    """``roundtrip`` for several (strategy, wrap) cases in the same processes (saves process start-ups)."""
    return {
        f"{strategy}-{wrap}": roundtrip(rank, world, f"{root}/{strategy}-{wrap}", strategy, wrap, storage)
        for strategy, wrap in cases
    }
