"""Parts of ``goodput bench checkpoint`` beyond the save strategies: restore against a raw read, S3 saves and
restores against a raw upload/download by the same client, and ``Run``'s per-step cost (one rank each, under
the worker's torchrun; see goodput/bench/_checkpoint_worker.py)."""

from __future__ import annotations

import glob
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState
from goodput.checkpoint.durable.objectstore import CONCURRENCY, PART_BYTES


def _max(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def _timed_restore(config: CheckpointConfig, state: TrainingState) -> tuple[float, dict[str, float]]:
    """The slowest rank's time for ``restore_latest`` into the live state, and this rank's parts."""
    parts: dict[str, float] = {}

    def on_event(name: str, **fields: Any) -> None:
        if name == "restore_parts":
            parts.update({k.removesuffix("_seconds"): v for k, v in fields.items() if k.endswith("_seconds")})

    manager = CheckpointManager(config, state, on_event=on_event)
    dist.barrier()
    t0 = time.perf_counter()
    step = manager.restore_latest()
    seconds = _max(time.perf_counter() - t0)
    manager.close()
    if step is None:
        raise RuntimeError(f"nothing to restore under {config.root}")
    return seconds, parts


def _read_floor(files: list[str], buffers: list[bytearray]) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    for path, buffer in zip(files, buffers, strict=True):
        with open(path, "rb", buffering=0) as f:
            f.readinto(buffer)
    return _max(time.perf_counter() - t0)


def restore_cost(config: CheckpointConfig, state: TrainingState, repeats: int = 9) -> dict[str, Any]:
    """Restore the newest checkpoint under ``config.root`` (local) vs a raw read of this rank's files."""
    rank = dist.get_rank()
    dist.barrier()
    steps = [p for p in glob.glob(os.path.join(config.root, "step-*")) if p.rsplit("-", 1)[1].isdigit()]
    newest = max(steps, key=lambda p: int(p.rsplit("-", 1)[1]))
    files = sorted(glob.glob(os.path.join(newest, f"__{rank}_*.distcp")))
    buffers = [bytearray(os.path.getsize(p)) for p in files]
    restores, floors, parts = [], [], []
    for _ in range(repeats):  # alternated, so load drift hits both
        floors.append(_read_floor(files, buffers))
        seconds, split = _timed_restore(config, state)
        restores.append(seconds)
        parts.append(split)
    return {
        "restore_s": _median(restores),
        "read_floor_s": _median(floors),
        "bytes_per_rank": sum(len(b) for b in buffers),
        "parts_s": {k: _median([p.get(k, 0.0) for p in parts]) for k in parts[0]},
        "ratio": _median([r / f for r, f in zip(restores, floors, strict=True)]),
    }


def s3_cost(
    state: TrainingState, local: list[torch.Tensor], cfg: dict[str, Any], saves: int = 3
) -> dict[str, Any]:
    """Durable dcp_async saves and restores on S3 vs a raw upload/download of this rank's bytes by s3fs at the
    same part size and concurrency."""
    from fsspec.core import url_to_fs

    options = cfg["s3_options"]
    rank = dist.get_rank()
    root = cfg["s3_root"]
    fs, _ = url_to_fs(root, **options)
    payload = b"".join(t.contiguous().numpy().tobytes() for t in local)
    raw_path = f"{root}/raw/rank{rank}.bin"
    # keep_last covers every save: retention's background purge of the previous step (a listing, manifest reads
    # and deletions on rank 0, on the same 2 cores as the server) would otherwise overlap the next raw put or save
    config = CheckpointConfig(
        root=f"{root}/ckpt", strategy="dcp_async", every=10**9, keep_last=saves + 2, storage_options=options,
        verify_checksums=True,
    )  # fmt: skip
    manager = CheckpointManager(config, state)
    puts, durables, gets, restores = [], [], [], []
    parts: list[dict[str, float]] = []
    for i in range(saves + 1):  # the first of each is a warm-up (connections, buffers)
        dist.barrier()
        t0 = time.perf_counter()
        fs.pipe_file(raw_path, payload, chunksize=PART_BYTES, max_concurrency=CONCURRENCY)
        put = _max(time.perf_counter() - t0)
        dist.barrier()
        manager.save(i + 1)
        result = manager.wait()
        durable = _max(result.persist_seconds if result and result.persist_seconds else float("nan"))
        if i:
            puts.append(put)
            durables.append(durable)
    manager.close()
    if (
        rank == 0
    ):  # then only the newest stays, as retention would have left it (the restores list every step)
        steps = sorted(
            int(p.rstrip("/").rsplit("-", 1)[1]) for p in fs.ls(config.root, detail=False) if "step-" in p
        )
        for step in steps[:-1]:
            fs.rm(f"{config.root}/step-{step}", recursive=True)
    dist.barrier()
    for i in range(saves + 1):
        fs.invalidate_cache()
        dist.barrier()
        t0 = time.perf_counter()
        got = fs.cat_file(raw_path, chunksize=PART_BYTES, max_concurrency=CONCURRENCY)  # s3fs's own
        get = _max(time.perf_counter() - t0)
        assert len(got) == len(payload)
        seconds, split = _timed_restore(config, state)
        if i:
            gets.append(get)
            restores.append(seconds)
            parts.append(split)
    return {
        "bytes_per_rank": len(payload),
        "part_bytes": PART_BYTES,
        "concurrency": CONCURRENCY,
        "raw_put_s": _median(puts),
        "raw_puts_s": puts,
        "durables_s": durables,
        "durable_s": _median(durables),
        "raw_get_s": _median(gets),
        "restore_s": _median(restores),
        "restore_parts_s": {k: _median([p.get(k, 0.0) for p in parts]) for k in parts[0]} if parts else {},
        "write_ratio": _median([p / d for p, d in zip(puts, durables, strict=True)]),
        "restore_ratio": _median([g / r for g, r in zip(gets, restores, strict=True)]),
    }


def run_step_overhead(run_dir: str, steps: int = 3000, rounds: int = 3) -> dict[str, Any]:
    """``Run``'s own per-step cost (ledger events, time-based save policy, watchdog beat, fault check) on a
    loop of trivial steps, against the same loop without ``Run``. Destroys the process group (``Run.close``)."""
    from goodput.run.run import Run

    model = torch.nn.Linear(4, 4)
    data = list(range(steps))
    x = torch.ones(4)
    config = CheckpointConfig(root=os.path.join(run_dir, "ckpt"), strategy="dcp", every="1h")
    run = Run(run_dir, checkpoint=config, progress=False, hang_timeout=300.0, backend="gloo")
    run.restore(model=model)
    overheads = []
    for r in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in data:
            x.mul_(1.0)
        bare = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in run.batches(data, steps=(r + 1) * steps):
            x.mul_(1.0)
            run.step_done()
        with_run = time.perf_counter() - t0
        overheads.append((with_run - bare) / steps)
    per_step = _max(_median(overheads))
    decisions = run.manager.decisions
    run.close()
    return {
        "per_step_s": per_step,
        "steps": steps,
        "save_decisions": decisions,
        "ratio": per_step / 0.010,
    }
