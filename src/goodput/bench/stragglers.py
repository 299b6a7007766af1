"""The straggler detector: detection, false alarms, the straggler_wait estimate, replacement and its cost.

    goodput bench stragglers [--steps 200] [--clean-steps 2000] [--json]

Runs the same 2-rank DDP loop (``goodput.bench._straggler_worker``: a 10 ms step of the user's own work) under
``goodput launch`` five times: clean for ``--clean-steps`` (the demo's length: false alarms), clean for
``--steps`` (the baseline), with rank 1's steps 1.5x as long (``slow@rank=1,factor=1.5,persist``: compute), with
rank 1's dataset 1.5x as slow (the user's own code: data), and the compute slowdown again under
``--restart warm`` with ``StragglerConfig(replace=True)``. From the ledgers it prints the steps to the alarm, the
ratio of ``straggler_wait`` to the time the slowdown added (slowed run's step time minus the clean run's), the
throughput after the hand-over to the spare over the clean throughput, and the detector's cost per step (its
bookkeeping, the timed hook per bucket and the window's all-gather amortised) over a 10 ms step, beside the cost
with a blocking all-gather measured in the same run (the baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

__all__ = ["add_arguments", "run"]

_WORKER = os.path.join(os.path.dirname(__file__), "_straggler_worker.py")
_BASE = 0.01


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=200, help="steps of each slowed run (default 200)")
    parser.add_argument("--clean-steps", type=int, default=2000, help="steps of the false-alarm run (2000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _launch(run_dir: str, steps: int, *extra: str, faults: str = "", warm: bool = False) -> None:
    command = [sys.executable, "-m", "goodput", "launch", "--nproc", "2", "--run-dir", run_dir]
    if warm:
        command += ["--restart", "warm", "--spares", "1", "--max-restarts", "2"]
    if faults:
        command += ["--faults", faults]
    command += ["--", _WORKER, "--steps", str(steps), "--base", str(_BASE), *extra]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}: {proc.stderr[-2000:]}")


def _ledger(run_dir: str) -> dict[str, Any]:
    """Rank 0's steps (per attempt), the alarms, and straggler_wait from the run's report."""
    from goodput.ledger.ledger import read_events
    from goodput.ledger.report import load_report

    events = read_events(run_dir, rank=None)
    acc = load_report(run_dir).accounting
    alarms = [e for e in events if e.get("event") == "straggler_alarm"]
    last = max(e["attempt"] for e in events if e.get("rank") == 0)
    ends = [e for e in events if e.get("event") == "step_end" and e.get("rank") == 0 and e["attempt"] == last]
    return {
        "alarms": alarms,
        "straggler_wait": acc.categories["straggler_wait"],
        "step_seconds": _steps_span(events) / max(1, len([e for e in events if e.get("event") == "step_end"
                                                           and e.get("rank") == 0])),
        "last_attempt_rate": _rate(ends),
    }  # fmt: skip


def _steps_span(events: list[dict[str, Any]]) -> float:
    """Seconds from rank 0's first step start to its last step end, over every attempt (monotonic, per
    attempt summed)."""
    total = 0.0
    for attempt in {e["attempt"] for e in events if e.get("rank") == 0}:
        mine = [e for e in events if e.get("rank") == 0 and e["attempt"] == attempt]
        starts = [float(e["mono"]) for e in mine if e.get("event") == "step_start"]
        ends = [float(e["mono"]) for e in mine if e.get("event") == "step_end"]
        if starts and ends:
            total += max(ends) - min(starts)
    return total


def _rate(ends: list[dict[str, Any]]) -> float:
    """Steps per second over an attempt's steps, its first 5 (warm-up) left out."""
    monos = sorted(float(e["mono"]) for e in ends)[5:]
    return (len(monos) - 1) / (monos[-1] - monos[0]) if len(monos) > 2 else 0.0


def _overhead() -> dict[str, float]:
    """Seconds per step of the detector's own work, in this process: bookkeeping of a step, the timed hook's
    extra work per bucket (two clock reads and a chained future), the window's exchange amortised."""
    import torch

    from goodput.run.stragglers import StragglerConfig, StragglerMonitor

    config = StragglerConfig()
    monitor = StragglerMonitor(
        config, rank=0, world_size=1, record=lambda *a, **k: None, export=lambda s, m: None
    )
    step_samples, hook_samples = [], []
    for step in range(1, 2001):
        start = time.perf_counter()
        monitor.handed()
        with monitor.section("step"):
            pass
        monitor.step_done(step, 0.0)
        step_samples.append(time.perf_counter() - start)
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        start = time.perf_counter()
        time.perf_counter()
        chained = future.then(lambda f: (time.perf_counter(), f.value())[1])
        future.set_result(torch.zeros(1))
        chained.wait()
        hook_samples.append(time.perf_counter() - start)
    return {"step": statistics.median(step_samples), "hook_per_bucket": statistics.median(hook_samples)}


def _gather_rank(rank: int, world: int) -> tuple[float, float]:
    """Seconds per step of one window's exchange (9 floats) on 2 real gloo ranks, amortised over a window: the
    detector's way (a sum into a preallocated buffer started at a window's end, read after the next step's own
    all-reduce) and, as the baseline, a blocking all-gather of the same values."""
    import torch
    import torch.distributed as dist

    from goodput.run.stragglers import StragglerConfig
    from goodput.run.stragglers.monitor import Exchange

    grads = torch.zeros(1024)
    exchange = Exchange(9, rank, world)  # made once per group, as the detector does
    started, blocking = [], []
    for _ in range(200):
        dist.barrier()
        start = time.perf_counter()
        exchange.start([0.01] * 9)
        issued = time.perf_counter() - start
        dist.all_reduce(grads)  # the next step's own collective
        start = time.perf_counter()
        exchange.result()
        started.append(issued + time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        out = [torch.empty(9, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(out, torch.zeros(9, dtype=torch.float64))
        blocking.append(time.perf_counter() - start)
    every = StragglerConfig().every
    return statistics.median(started) / every, statistics.median(blocking) / every


def run(args: argparse.Namespace) -> int:
    from goodput.errors import ConfigError

    if args.steps < 40 or args.clean_steps < args.steps:
        raise ConfigError(
            f"--steps must be >= 40 and --clean-steps >= --steps, got {args.steps}, {args.clean_steps}"
        )
    slow = "slow@rank=1,factor=1.5,persist"
    with tempfile.TemporaryDirectory(prefix="goodput-stragglers-") as tmp:
        runs: dict[str, dict[str, Any]] = {}
        for name, steps, extra, faults, warm in (
            ("clean_long", args.clean_steps, (), "", False),
            ("clean", args.steps, (), "", False),
            ("compute", args.steps, (), slow, False),
            ("data", args.steps, ("--slow-rank", "1", "--slow-in", "data"), "", False),
            ("replace", args.steps, ("--replace",), slow, True),
        ):
            folder = os.path.join(tmp, name)
            _launch(folder, steps, *extra, faults=faults, warm=warm)
            runs[name] = _ledger(folder)
    from goodput.testing.dist import run_ranks

    cost = _overhead()
    gathers = run_ranks(_gather_rank, 2, timeout=300)
    cost["gather"] = max(g[0] for g in gathers)
    cost["gather_if_blocking"] = max(g[1] for g in gathers)
    result = _result(args, runs, cost)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:<36} {value}")
    return 0


def _result(
    args: argparse.Namespace, runs: dict[str, dict[str, Any]], cost: dict[str, float]
) -> dict[str, Any]:
    clean, compute = runs["clean"], runs["compute"]

    def detected(run: dict[str, Any]) -> int | None:
        named = [a for a in run["alarms"] if a.get("straggler_rank") == 1]
        return int(named[0]["step"]) if named else None

    added = (compute["step_seconds"] - clean["step_seconds"]) * args.steps
    overhead = cost["step"] + cost["hook_per_bucket"] + cost["gather"]  # one bucket: the worker's model
    blocking = overhead - cost["gather"] + cost["gather_if_blocking"]
    return {
        "steps": args.steps,
        "clean_steps": args.clean_steps,
        "false_alarms_clean": len(runs["clean_long"]["alarms"]) + len(clean["alarms"]),
        "detected_at_step_compute": detected(compute),
        "detected_at_step_data": detected(runs["data"]),
        "kind_data": next((a.get("kind") for a in runs["data"]["alarms"]), None),
        "straggler_wait_seconds": round(compute["straggler_wait"], 4),
        "added_seconds": round(added, 4),
        "straggler_wait_over_added": round(compute["straggler_wait"] / added, 4) if added > 0 else None,
        "throughput_after_replacement_over_clean": round(
            runs["replace"]["last_attempt_rate"] / clean["last_attempt_rate"], 4
        ),
        "replaced": bool(runs["replace"]["alarms"]),
        "overhead_us_per_step": round(1e6 * overhead, 2),
        "overhead_parts_us": {k: round(1e6 * v, 2) for k, v in cost.items()},
        "overhead_over_10ms_step": round(overhead / _BASE, 5),
        "overhead_over_10ms_step_if_blocking_gather": round(blocking / _BASE, 5),
    }
