"""Module-level functions for the world-size-change tests (spawned ranks must be able to import them)."""

from __future__ import annotations

from typing import Any

from goodput.checkpoint import CheckpointConfig, CheckpointManager
from tests.helpers.ckpt_ranks import Job, next_draws

SEED = 7  # the data position's seed: the rule seeds added ranks from it


class GlobalLoader:
    """A data position that is the same on every rank (like ResumableLoader's): samples consumed globally."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.consumed = 0

    def advance(self) -> None:
        self.consumed += 2 * self.world

    def state_dict(self) -> dict[str, Any]:
        return {"seed": SEED, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consumed = int(state["consumed"])


def _job(rank: int, world: int, wrap: str, seed: int) -> Job:
    job = Job(rank, wrap=wrap, seed=seed)
    job.loader = job.state.loader = GlobalLoader(world)  # type: ignore[assignment]
    return job


def _observe(job: Job, restored: int | None) -> dict[str, Any]:
    return {"restored": restored, "step": job.state.step, "snap": job.snapshot(), "draws": next_draws()}


def phase(rank: int, world: int, root: str, cases: list[tuple[str, str]], restore: bool) -> dict[str, Any]:
    """Per case: restore the newest checkpoint (if ``restore``) and observe it, then train 2 steps, save, and
    observe the saved state and the draws that follow it."""
    out: dict[str, Any] = {}
    for strategy, wrap in cases:
        job = _job(rank, world, wrap, seed=5 if restore else 0)
        config = CheckpointConfig(root=f"{root}/{strategy}-{wrap}", strategy=strategy, every=1, keep_last=2)
        manager = CheckpointManager(config, job.state)
        loaded = manager.restore_latest() if restore else None
        got = _observe(job, loaded) if restore else None
        start = job.state.step
        for step in range(start + 1, start + 3):
            job.step()
            job.state.step = step
        manager.save(start + 2)
        manager.wait()
        out[f"{strategy}-{wrap}"] = {"restore": got, "saved": _observe(job, None)}
        manager.close()
    return out
