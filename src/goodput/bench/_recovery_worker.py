"""One rank of ``goodput bench recovery`` (started by torchrun; see goodput/bench/recovery.py).

python -m torch.distributed.run --standalone --nproc-per-node=2 -m goodput.bench._recovery_worker CONFIG_JSON
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from goodput.checkpoint import CheckpointConfig, CheckpointManager, MemoryTier, TrainingState
from goodput.distributed import init_distributed

_YEAR = 365 * 86400.0


class _Position:
    """A loader-like position, so the restore also brings back a data position."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


def _state(state_bytes: int) -> TrainingState:
    """Linear layers + AdamW (12 bytes per parameter) of ``state_bytes`` on this rank, optimizer state created."""
    width = min(2048, int(math.sqrt(state_bytes / 36)) // 64 * 64)
    layers = max(1, math.ceil(state_bytes / (12 * width * width)))
    torch.manual_seed(0)  # replicas, as under DDP (DCP keeps one copy of a tensor every rank holds)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return TrainingState(model=model, optimizer=opt, loader=_Position())


def _tensors(state: TrainingState) -> list[torch.Tensor]:
    assert state.model is not None and state.optimizer is not None
    out = [p.detach() for p in state.model.parameters()]
    for s in state.optimizer.state.values():
        out += [v for v in s.values() if isinstance(v, torch.Tensor)]
    return out


def _memcpy_floor(state: TrainingState, repeats: int = 3) -> tuple[float, int]:
    """A copy of the same bytes into preallocated buffers (median seconds, bytes), on every rank at once."""
    tensors = _tensors(state)
    total = sum(t.numel() * t.element_size() for t in tensors)
    buffer = torch.empty(total, dtype=torch.uint8)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()  # every rank copies at once, as every rank saves and restores at once
        start, offset = time.perf_counter(), 0
        for t in tensors:
            n = t.numel() * t.element_size()
            buffer[offset : offset + n].copy_(t.reshape(-1).view(torch.uint8))
            offset += n
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]), total


def _fingerprint(state: TrainingState) -> float:
    return float(sum(t.double().sum() for t in _tensors(state)))


class _MemorySampler:
    """Peak private (``RssAnon``) and shared (``RssShmem``: the tier's RAM files) resident memory of this
    process, sampled every 2 ms in a thread, as increases over the level at the start."""

    def __init__(self) -> None:
        self.start = self._now()
        self.peak = dict(self.start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @staticmethod
    def _now() -> dict[str, int]:
        with open("/proc/self/status", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("RssAnon", "RssShmem")))
        return {k: int(v.split()[0]) * 1024 for k, v in fields.items()}

    def _loop(self) -> None:
        while not self._stop.wait(0.002):
            for k, v in self._now().items():
                self.peak[k] = max(self.peak[k], v)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return {k: self.peak[k] - self.start[k] for k in self.start}


class _Events:
    def __init__(self) -> None:
        self.rows: list[tuple[float, str, dict[str, Any]]] = []

    def __call__(self, name: str, **fields: Any) -> None:
        self.rows.append((time.monotonic(), name, fields))

    def last(self, name: str) -> dict[str, Any]:
        return [f for _, n, f in self.rows if n == name][-1]


def _config(cfg: dict[str, Any], root: str, memory: MemoryTier | None, **kw: Any) -> CheckpointConfig:
    return CheckpointConfig(
        root=root, strategy="dcp_async", storage_options=cfg["storage_options"], memory=memory, **kw
    )


def _costs(cfg: dict[str, Any], state: TrainingState) -> dict[str, Any]:
    """Stall of memory saves, then memory and durable restores of the same step."""
    root = f"{cfg['root']}/costs"
    tier = MemoryTier(every=1, folder=cfg["memory_folder"])
    events = _Events()
    manager = CheckpointManager(_config(cfg, root, tier, every=10**9), state, on_event=events)
    manager.restore_latest()
    memory: Any = manager.tier("memory")
    stalls = []
    sampler = _MemorySampler()
    for step in range(1, cfg["saves"] + 1):
        with torch.no_grad():
            next(iter(state.model.parameters())).add_(1e-3)  # type: ignore[union-attr]
        stalls.append(memory.save(step))
        memory.wait()
    grown = sampler.stop()
    saved_step = cfg["saves"]
    start = time.perf_counter()
    manager.save(saved_step)
    manager.wait()
    durable_save = time.perf_counter() - start
    manager.close(finished=False)
    expected = _fingerprint(state)
    restores: dict[str, list[float]] = {"memory": [], "durable": []}
    parts: list[dict[str, float]] = []
    # The memory restore is timed 3 times (median, like the floor: one sub-second sample on a shared machine
    # is mostly noise); the durable one once (it takes tens of seconds).
    floors: list[float] = []
    for tier_name, memory, last in [*[("memory", tier, n == 2) for n in range(3)], ("durable", None, True)]:
        if tier_name == "memory":  # the floor again at this moment: the box may be busier than at the start
            floors.append(_memcpy_floor(state, repeats=1)[0])
        for t in _tensors(state):
            t.zero_()
        events = _Events()
        again = CheckpointManager(_config(cfg, root, memory, every=10**9), state, on_event=events)
        assert again.restore_latest() == saved_step
        restored = events.last("checkpoint_restored")
        assert restored["tier"] == tier_name, restored
        if _fingerprint(state) != expected:
            raise RuntimeError(f"the {tier_name} restore did not bring back the saved state")
        restores[tier_name].append(float(restored["seconds"]))
        restored_from: Any = again.tier(tier_name)
        if tier_name == "memory" and restored_from is not None:
            parts.append(dict(restored_from.last_parts))
        again.close(finished=last)
    return {
        "memory_stall_s": statistics.median(stalls[1:]),  # the first save allocates the staging buffer
        # resident memory above the level before the memory saves: private (staging) and the tier's RAM files
        "memory_staging_peak_bytes": grown["RssAnon"],
        "memory_tier_peak_bytes": grown["RssShmem"],
        "memory_stalls_s": stalls,
        "durable_save_s": durable_save,
        "memory_restore_s": statistics.median(restores["memory"]),
        "memory_restores_s": restores["memory"],
        "memcpy_floor_at_restore_s": statistics.median(floors),  # each measured just before a memory restore
        "memory_restore_parts_s": {k: statistics.median(p[k] for p in parts) for k in parts[0]}
        if parts
        else {},
        "durable_restore_s": restores["durable"][0],
    }


def _loop(cfg: dict[str, Any], state: TrainingState, name: str, memory: bool) -> dict[str, Any]:
    """Train ``steps`` steps of ``step_ms`` with ``auto`` cadences; returns the commit timeline."""
    tier = MemoryTier(every="auto", folder=cfg["memory_folder"]) if memory else None
    events = _Events()
    config = _config(cfg, f"{cfg['root']}/{name}", tier, every="auto", gpus=1, afr=_YEAR / cfg["mtbf"])
    manager = CheckpointManager(config, state, on_event=events)
    manager.restore_latest()
    begin, step_ends = time.monotonic(), []
    for step in range(1, cfg["steps"] + 1):
        time.sleep(cfg["step_ms"] / 1000)  # the step's compute (sleeping leaves the cores to the saves)
        with torch.no_grad():
            next(iter(state.model.parameters())).add_(1e-6)  # type: ignore[union-attr]
        step_ends.append(time.monotonic() - begin)
        manager.maybe_save(step)
    manager.close(finished=True)
    commits = [
        (t - begin, int(f["step"])) for t, n, f in events.rows if n in ("memory_saved", "checkpoint_durable")
    ]
    picked = [
        f["interval_seconds"]
        for _, n, f in events.rows
        if n == "checkpoint_interval" and f.get("tier") == "memory"
    ]
    saved = [f for _, n, f in events.rows if n == "memory_saved"]
    return {
        "step_ends": step_ends,
        "commits": commits,
        "memory_interval_s": picked[-1] if picked else None,  # what auto picked last
        "memory_stall_s": statistics.median(f["stall_seconds"] for f in saved) if saved else None,
        "memory_persist_s": statistics.median(f["persist_seconds"] for f in saved) if saved else None,
    }


def _lost_steps(timeline: dict[str, Any], failures: list[float]) -> float:
    """Mean steps re-done per failure at the given times: steps done then minus the newest committed step."""
    lost = []
    for t in failures:
        done = sum(1 for end in timeline["step_ends"] if end <= t)
        committed = max((s for when, s in timeline["commits"] if when <= t), default=0)
        lost.append(done - committed)
    return float(np.mean(lost)) if lost else float("nan")


def _max(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _lost_work(cfg: dict[str, Any], state: TrainingState) -> dict[str, Any]:
    """Steps re-done per failure with and without the memory tier (the two loops; figures on rank 0)."""
    with_memory = _loop(cfg, state, "loop-memory", memory=True)
    durable_only = _loop(cfg, state, "loop-durable", memory=False)
    length = min(with_memory["step_ends"][-1], durable_only["step_ends"][-1])
    rng = np.random.default_rng(cfg["seed"])
    failures = [float(t) for t in rng.uniform(0, length, cfg["failures"])]
    return {
        "failures": len(failures),
        "lost_steps_per_failure": _lost_steps(with_memory, failures),
        "lost_steps_per_failure_durable_only": _lost_steps(durable_only, failures),
        "commits_with_memory": len(with_memory["commits"]),
        "commits_durable_only": len(durable_only["commits"]),
        "auto_memory": {  # what the memory tier's auto cadence saw and picked in the lost-work loop
            key: with_memory[key] for key in ("memory_interval_s", "memory_stall_s", "memory_persist_s")
        },
    }


def main() -> None:
    cfg = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    init_distributed("gloo")
    rank = dist.get_rank()
    state = _state(cfg["state_bytes"])
    floor, nbytes = _memcpy_floor(state)
    costs = _costs(cfg, state)
    for key in ("memory_staging_peak_bytes", "memory_tier_peak_bytes"):
        costs[key] = _max(float(costs[key]))
    lost = _lost_work(cfg, state) if cfg.get("loops", True) else {}
    if rank == 0:
        result = {
            "state_bytes_per_rank": nbytes,
            "world_size": dist.get_world_size(),
            "memcpy_floor_s": floor,
            **costs,
            "lost_steps_per_failure": None,
            "lost_steps_per_failure_durable_only": None,
            **lost,
        }
        with open(cfg["out"], "w", encoding="utf-8") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
