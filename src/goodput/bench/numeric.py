"""The numeric guard's cost per step, each detector against a 10 ms step, on the demo's model over 2 gloo ranks.

    goodput bench numeric --steps 300

Times, on each of 2 real gloo processes holding the demo's TinyLM (DDP-sized replicas) after a backward pass:
the gradient check before the optimizer step (``gradient_sum`` over every gradient), the one all-gather of
four int64 per step that every decision rides on (``gather_rows``), and the parameter fingerprint
(``fingerprint``) amortised over ``check_every`` steps. Each is printed as microseconds per step and as a
ratio to a 10 ms step (the goal: <= 0.01 each at the defaults), beside the step this machine measures for
the same model (forward, backward, AdamW step) as the baseline. The spike rule is a median over 100 floats.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="timed repetitions of each detector")
    parser.add_argument("--check-every", type=int, default=50, help="the fingerprint's interval (default 50)")


def _rank(rank: int, world: int, steps: int, check_every: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    from goodput.demo.model import ModelConfig, TinyLM
    from goodput.run._numeric_rules import encode_row, fingerprint, spike_threshold
    from goodput.run.numeric import gather_rows, gradient_sum

    torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS=1 for each worker
    torch.manual_seed(0)
    model = TinyLM(ModelConfig())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, 256, (16, 65))
    group = dist.new_group(backend="gloo")

    def step() -> None:
        model.loss(batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    step()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    params = list(model.parameters())
    history = [2.0 + 0.01 * i for i in range(100)]
    row = encode_row(1, 2.0, 0, 0.0)
    timed = {
        "step (baseline)": (step, 1),
        "gradient check": (lambda: gradient_sum(grads), 1),
        "all-gather": (lambda: gather_rows(row, group), 1),
        "fingerprint": (lambda: fingerprint(params), check_every),
        "spike rule": (lambda: spike_threshold(history, k=6.0, min_rise=0.1), 1),
    }
    out: dict[str, float] = {}
    for name, (fn, every) in timed.items():
        samples = []
        for _ in range(max(10, steps // (10 if name == "step (baseline)" else 1))):
            dist.barrier(group=group)
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        out[name] = statistics.median(samples) / every
    out["params"] = float(sum(p.numel() for p in params))
    return out


def run(args: argparse.Namespace) -> int:
    from goodput.errors import ConfigError
    from goodput.testing.dist import run_ranks

    if args.steps < 10 or args.check_every < 1:
        raise ConfigError(
            f"--steps must be >= 10 and --check-every >= 1, got {args.steps}, {args.check_every}"
        )
    results: list[dict[str, Any]] = run_ranks(_rank, 2, args.steps, args.check_every, timeout=600)
    worst = {k: max(r[k] for r in results) for k in results[0]}
    print(
        f"model: demo TinyLM, {int(worst.pop('params')):,} parameters, 2 gloo ranks (the slower rank shown)"
    )
    base = worst.pop("step (baseline)")
    print(f"baseline: this machine's step of that model: {1e3 * base:.2f} ms")
    for name, seconds in worst.items():
        interval = f" (every {args.check_every} steps, amortised)" if name == "fingerprint" else ""
        print(
            f"{name:<15} {1e6 * seconds:8.1f} us/step{interval}: ratio to a 10 ms step {seconds / 0.01:.4f}"
            f" {'<=' if seconds <= 1e-4 else '>'} 0.01; to this machine's step {seconds / base:.4f}"
        )
    total = sum(worst.values())
    print(f"{'all detectors':<15} {1e6 * total:8.1f} us/step: ratio to a 10 ms step {total / 0.01:.4f}")
    return 0
