"""The numeric guard's cost per step against a 10 ms step, and a drill's rollback and detection ratios.

    goodput bench numeric --steps 300 [--json]

Costs, on each of 2 real gloo processes holding the demo's TinyLM under DDP, as the guard runs them at its
defaults: the agreement and the gradient check on DDP's reduced buckets timed inside real DDP steps, the
guard's way (after) beside the way it had before (before), in alternating blocks of the same run
(:mod:`goodput.bench._numeric_steps`); for models without DDP's hook, the sum over every gradient; each
gradient check also amortised over the guard's default ``grads_every`` (its cost at the defaults); the replica
check (the parameters' fingerprint and sum) amortised over ``check_every`` steps; the spike rule. Each is a ratio to a 10 ms step (goal <= 0.01), beside this machine's
own step of the model. The drill (``goodput launch`` of ``_numeric_train.py`` over 2 ranks with a NaN, a spike
and a flipped bit) gives each rollback's time over the memory-tier restore inside it (goal <= 1.5) and the steps
from each anomaly to its detection (NaN, spike: <= 1; a flipped bit: <= the check interval).
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
from collections.abc import Callable
from typing import Any

__all__ = ["add_arguments", "run"]

_DRILL = "nan@step=6,rank=1; spike@step=20,factor=50; bitflip@step=29,rank=0"
_ANOMALY = {"nonfinite": 6, "spike": 20, "sdc": 29}
_CHECK_EVERY = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="timed repetitions of each detector")
    parser.add_argument("--check-every", type=int, default=50, help="the fingerprint's interval (default 50)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _median(fn: Callable[[], float], n: int) -> float:
    return statistics.median(fn() for _ in range(n))


def _rank(rank: int, world: int, steps: int, check_every: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    from goodput.bench._numeric_steps import in_step_costs
    from goodput.demo.model import ModelConfig, TinyLM
    from goodput.run.numeric.config import NumericConfig
    from goodput.run.numeric.ops import gradient_sum, parameter_sum
    from goodput.run.numeric.rules import fingerprint, spike_threshold

    torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS=1 for each worker
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(TinyLM(ModelConfig()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, 256, (16, 65))
    group = dist.new_group(backend="gloo")

    def backward() -> None:
        logits = model(batch[:, :-1])  # through DDP, so its all-reduce is part of the step
        torch.nn.functional.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1)).backward()

    def optimize() -> None:
        opt.step()
        opt.zero_grad(set_to_none=False)

    def step() -> None:
        backward()
        optimize()

    step()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    params = list(model.parameters())
    history = [2.0 + 0.01 * i for i in range(100)]

    def timed(fn: Callable[[], Any]) -> Callable[[], float]:
        def once() -> float:
            dist.barrier(group=group)
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start

        return once

    few, every = max(10, steps // 10), NumericConfig().grads_every
    costs = in_step_costs(model, backward, optimize, group, max(24, steps // 4))
    per_tensor = _median(timed(lambda: gradient_sum(grads)), steps)
    return {
        "step": _median(timed(step), few),
        **costs,
        "gradient check, per tensor": per_tensor,
        "gradient check, DDP, at the defaults": costs["gradient check, DDP, after"] / every,
        "gradient check, per tensor, at the defaults": per_tensor / every,
        "replica check": _median(timed(lambda: (fingerprint(params), parameter_sum(model))), steps)
        / check_every,
        "spike rule": _median(timed(lambda: spike_threshold(history, k=6.0, min_rise=0.1)), steps),
        "params": float(sum(p.numel() for p in params)),
    }


def _drill() -> dict[str, Any]:
    """Launch the drill and read its ledger: each rollback's time over its restore, and detection latencies."""
    from goodput.ledger.ledger import read_events

    script = os.path.join(os.path.dirname(__file__), "_numeric_train.py")
    with tempfile.TemporaryDirectory(prefix="goodput-numeric-") as tmp:
        run_dir = os.path.join(tmp, "run")
        command = [sys.executable, "-m", "goodput", "launch", "--nproc", "2", "--run-dir", run_dir]
        command += [
            "--max-restarts",
            "0",
            "--faults",
            _DRILL,
            "--",
            script,
            "--check-every",
            str(_CHECK_EVERY),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"the numeric drill failed (exit {done.returncode}): {done.stderr[-2000:]}")
        events = read_events(run_dir, rank=0)
    found = {e["kind"]: e for e in events if e["event"] == "numeric_fault"}
    rollbacks = [e for e in events if e["event"] == "rollback"]
    return {
        "rollback_over_restore": [round(e["seconds_total"] / e["seconds"], 3) for e in rollbacks],
        "rollback_tiers": [e["tier"] for e in rollbacks],
        "steps_to_detection": {
            k: found[k]["detected_at"] - step for k, step in _ANOMALY.items() if k in found
        },
        "check_every": _CHECK_EVERY,
    }


def run(args: argparse.Namespace) -> int:
    from goodput.errors import ConfigError
    from goodput.run.numeric.config import NumericConfig
    from goodput.testing.dist import run_ranks

    if args.steps < 10 or args.check_every < 1:
        raise ConfigError(
            f"--steps must be >= 10 and --check-every >= 1, got {args.steps}, {args.check_every}"
        )
    results: list[dict[str, float]] = run_ranks(_rank, 2, args.steps, args.check_every, timeout=600)
    worst = {k: max(r[k] for r in results) for k in results[0]}
    params, base = int(worst.pop("params")), worst.pop("step")
    result: dict[str, Any] = {
        "model": f"demo TinyLM under DDP, {params} parameters, 2 gloo ranks (the slower rank)",
        "grads_every": NumericConfig().grads_every,
        "step_ms": round(1e3 * base, 3),
        "cost_us": {k: round(1e6 * v, 1) for k, v in worst.items()},
        "cost_over_10ms_step": {k: round(v / 0.01, 4) for k, v in worst.items()},
        "cost_over_this_step": {k: round(v / base, 5) for k, v in worst.items()},
        **_drill(),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"model: {result['model']}; this machine's step of it: {result['step_ms']:.2f} ms")
    for name, seconds in worst.items():
        ratio = seconds / 0.01
        print(
            f"{name:<28} {1e6 * seconds:8.1f} us/step: / 10 ms step {ratio:.4f} {'<=' if ratio <= 0.01 else '>'} 0.01"
        )
    print(f"rollback / memory-tier restore inside it: {result['rollback_over_restore']} (goal <= 1.5)")
    print(f"steps from anomaly to detection: {result['steps_to_detection']} (goal: nonfinite, spike <= 1; "
          f"sdc <= {_CHECK_EVERY})")  # fmt: skip
    return 0
