"""One rank of ``goodput bench checkpoint`` (started by torchrun; see goodput/bench/checkpoint.py).

python -m torch.distributed.run --standalone --nproc-per-node=2 -m goodput.bench._checkpoint_worker CONFIG_JSON
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
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

from goodput._env import BENCH_S3_OPTIONS
from goodput.bench import _durable_write as durable_write
from goodput.bench._checkpoint_io import restore_cost, run_step_overhead, s3_cost
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
    """A training-like step: fixed compute, a gradient-sized all-reduce, and an in-place weight change.

    ``idle=True``: the step's compute is a sleep of the same length, as a host waiting for its GPU (no CPU work).
    """

    def __init__(self, model: torch.nn.Module, step_ms: float, *, idle: bool = False) -> None:
        self.idle = idle
        self.step_s = step_ms / 1000  # the nominal step (the measured one is longer: all-reduce, load)
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
        if self.idle:
            time.sleep(self.step_s)
        else:
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


class Floors:
    """The physical floors of a save, measured on the same bytes, all ranks at once (as the strategies save):
    a memcpy into preallocated buffers, and the fastest durable write of every local tensor into new files
    (goodput.bench._durable_write: one file, several files by several threads, or O_DIRECT; the fastest on
    this disk is chosen by one timed write of each at the start, then used before every save)."""

    def __init__(self, local: list[torch.Tensor], root: str, rank: int) -> None:
        self.local = local
        self.buffers = [torch.empty_like(t) for t in local]
        self.path = os.path.join(root, f"raw-write-{rank}")
        self.method = ""
        self.calibration: dict[str, float] = {}

    def _memcpy(self) -> None:
        for b, t in zip(self.buffers, self.local, strict=True):
            b.copy_(t)

    def memcpy(self) -> float:
        return timed(self._memcpy, 1)

    def _write(self, method: str) -> float:
        views = [t.contiguous().numpy() for t in self.local]
        settle_disk()
        seconds = timed(lambda: durable_write.METHODS[method](views, self.path), 1)
        durable_write.remove(self.path)
        return seconds

    def raw_write(self) -> float:
        if not self.method:
            self.calibration = {m: self._write(m) for m in durable_write.METHODS}
            self.method = min(self.calibration, key=lambda m: self.calibration[m])
        return self._write(self.method)


def settle_disk() -> None:
    """Write back every dirty page and pending deletion (untimed), so that a timed write does not pay for
    an earlier one's: on a file system mounted with ``discard`` a commit also discards freed blocks."""
    os.sync()


def measure(
    name: str,
    state: TrainingState,
    loop: Loop,
    floors: Floors,
    cfg: dict[str, Any],
    sampler: RssSampler,
    tag: str = "",
) -> dict[str, Any]:
    """Saves of one strategy, each paired with a window without a save and with the floors measured just
    before it (the machine is shared: pairing keeps load drift out of the differences)."""
    strategy, checkpointer = ("dcp_async", "process") if name == "dcp_async_process" else (name, "thread")
    config = CheckpointConfig(
        root=os.path.join(cfg["root"], name + tag),
        strategy=strategy,
        every=10**9,
        keep_last=1,
        async_checkpointer=checkpointer,
        verify_checksums=cfg["checksums"] == "on",
    )
    release_freed_memory()
    rss_before = sampler.reset()
    manager = CheckpointManager(config, state)
    rows: dict[str, list[float]] = {
        k: [] for k in ("stall", "lost", "durable", "bytes", "memcpy", "raw_write", "raw_write_after")
    }
    steps = cfg["window"]
    for i in range(cfg["saves"] + 1):  # the first save (buffer allocation, helper start) is a warm-up
        memcpy = floors.memcpy()
        raw_write = floors.raw_write() if name == "dcp" else float("nan")
        without = timed(functools.partial(loop.window, steps), 1)
        settle_disk()  # as before the floor: the save starts with no earlier write or deletion pending
        dist.barrier()
        t0 = time.perf_counter()
        first = manager.save(i + 1)
        loop.window(steps)
        final = manager.wait() or first
        with_save = across_ranks_max(time.perf_counter() - t0)
        if i == 0:
            # the window must outlast an asynchronous save's background work, or "lost" would count the wait
            # for it at the window's end (training waits for nothing until the next save, an interval later)
            durable = across_ranks_max(final.persist_seconds or 0.0)
            steps = min(cfg["max_window"], max(cfg["window"], math.ceil(1.5 * durable / loop.step_s)))
            continue
        rows["stall"].append(across_ranks_max(first.stall_seconds))
        rows["lost"].append(with_save - without)
        rows["durable"].append(across_ranks_max(final.persist_seconds or 0.0))
        rows["bytes"].append(float(final.bytes or 0))
        rows["memcpy"].append(memcpy)
        rows["raw_write"].append(raw_write)
        # the floor again once the save is durable: a disk's speed can change within a run (a write soon after
        # another may be slower), and the two floors around a save show by how much (``raw_write_drift``)
        rows["raw_write_after"].append(floors.raw_write() if name == "dcp" else float("nan"))
    peak = across_ranks_max(float(sampler.peak - rss_before))
    manager.close()
    return {
        "window_steps": steps,
        "stall_s": median(rows["stall"]),
        "lost_s": median(rows["lost"]),
        "durable_s": median(rows["durable"]),
        "bytes": int(median(rows["bytes"])),
        "peak_extra_mem_bytes": int(peak),
        "stall_over_memcpy": median([a / b for a, b in zip(rows["stall"], rows["memcpy"], strict=True)]),
        "raw_write_over_durable": median(
            [a / b for a, b in zip(rows["raw_write"], rows["durable"], strict=True)]
        ),
        "raw_write_drift": median(
            [max(a, c) / min(a, c) for a, c in zip(rows["raw_write"], rows["raw_write_after"], strict=True)]
        ),
        "per_save": rows,
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


def beyond_strategies(
    model: torch.nn.Module,
    state: TrainingState,
    local: list[torch.Tensor],
    floors: Floors,
    cfg: dict[str, Any],
    sampler: RssSampler,
    step_s: float,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The idle-host windows, restore, S3 and Run's per-step cost (the last ends the process group)."""
    idle = {}
    if cfg["idle_host"]:
        idle_loop = Loop(model, step_s * 1000, idle=True)
        for name in ("torch_save", "dcp_async", "dcp_async_process"):
            idle[name] = measure(name, state, idle_loop, floors, cfg, sampler, tag="-idle")
    sampler.stop()
    saved = "dcp_async" if "dcp_async" in cfg["strategies"].split(",") else "dcp"  # the CLI asks for one
    restore = restore_cost(
        CheckpointConfig(
            root=os.path.join(cfg["root"], saved), strategy=saved, verify_checksums=cfg["checksums"] == "on"
        ),
        state,
    )
    s3 = s3_cost(state, local, cfg) if cfg.get("s3_root") else {}
    run_cost = run_step_overhead(os.path.join(cfg["root"], "run"))  # last: Run.close ends the group
    return idle, restore, s3, run_cost


def main(cfg: dict[str, Any]) -> None:
    s3_options = os.environ.pop(BENCH_S3_OPTIONS.name, "")  # credentials travel outside argv
    if s3_options:
        cfg["s3_options"] = json.loads(s3_options)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(cfg["root"], exist_ok=True)
    model, opt, local = build_state(cfg["state_bytes"], world)
    local_bytes = sum(t.numel() * t.element_size() for t in local)
    state = TrainingState(model=model, optimizer=opt)
    loop = Loop(model, cfg["step_ms"])
    sampler = RssSampler()
    floors = Floors(local, cfg["root"], rank)
    loop.window(3)
    step_s = timed(lambda: loop.window(cfg["window"]), 1) / cfg["window"]
    strategies = {
        name: measure(name, state, loop, floors, cfg, sampler) for name in cfg["strategies"].split(",")
    }
    no_staging: dict[str, Any] = {"extra_after_each_save_bytes": []}
    staging = staging_memory(state, loop, cfg, sampler) if cfg["staging_saves"] > 0 else no_staging
    idle, restore, s3, run_cost = beyond_strategies(model, state, local, floors, cfg, sampler, step_s)
    extra = staging["extra_after_each_save_bytes"]
    ts, da, dc = strategies.get("torch_save", {}), strategies.get("dcp_async", {}), strategies.get("dcp", {})
    result = {
        "state_bytes": local_bytes * world,
        "local_state_bytes": local_bytes,
        "world_size": world,
        "step_ms": step_s * 1000,
        "window_steps": cfg["window"],
        "checksums": cfg["checksums"],
        "floors": {
            "memcpy_s": median(da.get("per_save", {}).get("memcpy", [])),
            "raw_write_s": median(dc.get("per_save", {}).get("raw_write", [])),
            "raw_write_after_s": median(dc.get("per_save", {}).get("raw_write_after", [])),
            "raw_write_drift": dc.get("raw_write_drift"),
            "raw_write_method": floors.method,
            "raw_write_calibration_s": floors.calibration,
        },
        "strategies": strategies,
        "idle_host": {
            k: {"stall_s": v["stall_s"], "lost_s": v["lost_s"], "window_steps": v["window_steps"]}
            for k, v in idle.items()
        },
        "restore": restore,
        "s3": s3,
        "run": run_cost,
        "staging": staging,
        "ratios": {
            "torch_save_stall_over_async_stall": ratio(ts.get("stall_s"), da.get("stall_s")),
            "async_stall_over_memcpy_floor": da.get("stall_over_memcpy"),
            "torch_save_lost_over_async_lost": ratio(ts.get("lost_s"), da.get("lost_s")),
            "dcp_write_over_raw_write": dc.get("raw_write_over_durable"),
            "staging_memory_over_state_bytes": ratio(max(extra) if extra else None, float(local_bytes)),
            "staging_memory_last_over_second": ratio(extra[-1], extra[1]) if len(extra) > 1 else None,
            "torch_save_lost_over_async_lost_idle_host": ratio(
                idle.get("torch_save", {}).get("lost_s"), idle.get("dcp_async", {}).get("lost_s")
            ),
            "torch_save_lost_over_async_process_lost_idle_host": ratio(
                idle.get("torch_save", {}).get("lost_s"), idle.get("dcp_async_process", {}).get("lost_s")
            ),
            "restore_over_read_floor": restore["ratio"],
            "s3_write_over_raw_put": s3.get("write_ratio"),
            "s3_restore_over_raw_get": s3.get("restore_ratio"),
            "run_step_overhead_over_10ms": run_cost["ratio"],
        },
    }
    if rank == 0:
        with open(cfg["out"], "w", encoding="utf-8") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
