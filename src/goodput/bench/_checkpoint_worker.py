"""One rank of ``goodput bench checkpoint`` (started by torchrun; see goodput/bench/checkpoint.py).

python -m torch.distributed.run --standalone --nproc-per-node=2 -m goodput.bench._checkpoint_worker CONFIG_JSON
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from goodput.bench.checkpoint import RssSampler, median, ratio
from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState


def build_state(
    state_bytes: int, world: int
) -> tuple[torch.nn.Module, torch.optim.Optimizer, list[torch.Tensor]]:
    """Linear layers + AdamW (12 bytes per parameter), FSDP2-sharded over the ranks, optimizer state created."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    width = min(2048, int(math.sqrt(state_bytes / 48)) // 64 * 64)
    layers = max(1, round(state_bytes / (12 * width * width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    local = [p.detach().to_local() for p in model.parameters()]  # type: ignore[attr-defined]
    for s in opt.state.values():
        local += [v.to_local() if hasattr(v, "to_local") else v for v in s.values() if v.dim() > 0]
    return model, opt, local


class Loop:
    """A training-like step: fixed compute, a gradient-sized all-reduce, and an in-place weight change."""

    def __init__(self, model: torch.nn.Module, step_ms: float) -> None:
        self.params = [p.detach().to_local() for p in model.parameters()]  # type: ignore[attr-defined]
        self.a = torch.randn(256, 256)
        self.sync = torch.zeros(1024)
        t0 = time.perf_counter()
        for _ in range(20):
            self.a @ self.a
        per = (time.perf_counter() - t0) / 20
        iters = torch.tensor([max(1, int(step_ms / 1000 / per))])
        dist.broadcast(iters, src=0)
        self.iters = int(iters.item())
        self.i = 0

    def step(self) -> None:
        for _ in range(self.iters):
            self.a @ self.a
        dist.all_reduce(self.sync)
        with torch.no_grad():
            self.params[self.i % len(self.params)].add_(1e-6)
        self.i += 1

    def window(self, steps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        return time.perf_counter() - t0


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS, so resident memory measures what is live."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def across_ranks_max(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median over repeats of the slowest rank's time for fn (all ranks start together)."""
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(across_ranks_max(time.perf_counter() - t0))
    return median(times)


def floors(local: list[torch.Tensor], root: str, rank: int) -> dict[str, float]:
    buffers = [torch.empty_like(t) for t in local]

    def memcpy() -> None:
        for b, t in zip(buffers, local, strict=True):
            b.copy_(t)

    path = os.path.join(root, f"raw-write-{rank}.bin")

    def raw_write() -> None:
        with open(path, "wb") as f:
            for t in local:
                f.write(t.contiguous().numpy().data)
            f.flush()
            os.fsync(f.fileno())

    result = {"memcpy_s": timed(memcpy, 3), "raw_write_s": timed(raw_write, 2)}
    os.remove(path)
    return result


def measure(
    name: str, state: TrainingState, loop: Loop, base: float, cfg: dict[str, Any], sampler: RssSampler
) -> dict[str, Any]:
    strategy, checkpointer = ("dcp_async", "process") if name == "dcp_async_process" else (name, "thread")
    config = CheckpointConfig(
        root=os.path.join(cfg["root"], name),
        strategy=strategy,
        every=10**9,
        keep_last=1,
        async_checkpointer=checkpointer,
        verify_checksums=cfg["checksums"] == "on",
    )
    release_freed_memory()
    rss_before = sampler.reset()
    manager = CheckpointManager(config, state)
    step = 1
    stalls, lost, durable, sizes = [], [], [], []
    for i in range(cfg["saves"] + 1):  # the first save (buffer allocation, helper start) is a warm-up
        dist.barrier()
        t0 = time.perf_counter()
        first = manager.save(step)
        loop.window(cfg["window"])
        final = manager.wait() or first
        elapsed = time.perf_counter() - t0
        step += 1
        if i == 0:
            continue
        stalls.append(across_ranks_max(first.stall_seconds))
        lost.append(across_ranks_max(elapsed - base))
        durable.append(across_ranks_max(final.persist_seconds or 0.0))
        sizes.append(final.bytes or 0)
    peak = across_ranks_max(float(sampler.peak - rss_before))
    manager.close()
    return {
        "stall_s": median(stalls),
        "lost_s": median(lost),
        "durable_s": median(durable),
        "bytes": int(median([float(s) for s in sizes])),
        "peak_extra_mem_bytes": int(peak),
        "stalls_s": stalls,
        "lost_per_save_s": lost,
    }


def staging_memory(
    state: TrainingState, loop: Loop, cfg: dict[str, Any], sampler: RssSampler
) -> dict[str, Any]:
    """Resident memory above the pre-save level after each of N async saves (buffers must be reused)."""
    config = CheckpointConfig(
        root=os.path.join(cfg["root"], "staging"), strategy="dcp_async", every=10**9, keep_last=1,
        verify_checksums=False,
    )  # fmt: skip
    release_freed_memory()
    before = sampler.now()
    manager = CheckpointManager(config, state)
    extra = []
    for step in range(1, cfg["staging_saves"] + 1):
        manager.save(step)
        loop.window(2)
        manager.wait()
        extra.append(across_ranks_max(float(sampler.now() - before)))
    manager.close()
    return {"extra_after_each_save_bytes": extra}


def main(cfg: dict[str, Any]) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(cfg["root"], exist_ok=True)
    model, opt, local = build_state(cfg["state_bytes"], world)
    local_bytes = sum(t.numel() * t.element_size() for t in local)
    state = TrainingState(model=model, optimizer=opt)
    loop = Loop(model, cfg["step_ms"])
    sampler = RssSampler()
    floor = floors(local, cfg["root"], rank)
    loop.window(3)
    base = median([timed(lambda: loop.window(cfg["window"]), 1) for _ in range(3)])
    strategies = {
        name: measure(name, state, loop, base, cfg, sampler) for name in cfg["strategies"].split(",")
    }
    staging = (
        staging_memory(state, loop, cfg, sampler)
        if cfg["staging_saves"] > 0
        else {"extra_after_each_save_bytes": []}
    )
    sampler.stop()
    extra = staging["extra_after_each_save_bytes"]
    ts, da, dc = strategies.get("torch_save", {}), strategies.get("dcp_async", {}), strategies.get("dcp", {})
    result = {
        "state_bytes": sum(t.numel() * t.element_size() for t in local) * world,
        "local_state_bytes": local_bytes,
        "world_size": world,
        "step_ms": base / cfg["window"] * 1000,
        "window_steps": cfg["window"],
        "window_without_save_s": base,
        "checksums": cfg["checksums"],
        "floors": floor,
        "strategies": strategies,
        "staging": staging,
        "ratios": {
            "torch_save_stall_over_async_stall": ratio(ts.get("stall_s"), da.get("stall_s")),
            "async_stall_over_memcpy_floor": ratio(da.get("stall_s"), floor["memcpy_s"]),
            "torch_save_lost_over_async_lost": ratio(ts.get("lost_s"), da.get("lost_s")),
            "dcp_write_over_raw_write": ratio(floor["raw_write_s"], dc.get("durable_s")),
            "staging_memory_over_state_bytes": ratio(max(extra) if extra else None, float(local_bytes)),
            "staging_memory_last_over_second": ratio(extra[-1], extra[1]) if len(extra) > 1 else None,
        },
    }
    if rank == 0:
        with open(cfg["out"], "w", encoding="utf-8") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
