"""The ledger's cost to a training loop: per-step overhead and the slowest ledger call, against no ledger.

    goodput bench ledger --steps 20000
    goodput bench ledger --report-steps 1000,10000,100000 --report-attempts 100 --report-ranks 8

Runs the same small CPU step (a matrix product) N times without a ledger, then with one (step_start and
step_end with fetch time and loss on every step, the background flush every 0.5 s, with and without fsync),
and prints the overhead per step, the ratio of loop times, and the slowest single ledger call: a call that
waited on the disk would show here as milliseconds.

Then the Lightning and Hugging Face callbacks (goodput.integrations), when those packages are installed: their
per-step hooks, each call timed, and their loader wrapper against the bare loader (bench/_callbacks.py).

With ``--report-steps``, instead: the time ``goodput report`` takes (``load_report``: reading every rank's
files and accounting) on a synthesized ledger (bench/_ledger_synth.py) of each number of steps per rank, with
``--report-attempts`` attempts and ``--report-ranks`` ranks, and each time over the previous size's beside the
ratio of their events: linear in events when the two agree.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=20_000, help="steps per measured loop (default 20000)")
    parser.add_argument("--size", type=int, default=48, help="side of the matrices multiplied per step")
    parser.add_argument(
        "--report-steps",
        help="comma list of steps per rank: time goodput report on synthesized ledgers instead",
    )
    parser.add_argument("--report-attempts", type=int, default=1000, help="attempts of those ledgers (1000)")
    parser.add_argument("--report-ranks", type=int, default=64, help="ranks of those ledgers (64)")


def _loop(steps: int, work: Any, ledger: Any) -> tuple[float, float]:
    """Seconds for the loop, and the slowest ledger call in it."""
    slowest = 0.0
    start = time.perf_counter()
    for step in range(1, steps + 1):
        if ledger is not None:
            t0 = time.perf_counter()
            ledger.step_start(step)
            slowest = max(slowest, time.perf_counter() - t0)
        work()
        if ledger is not None:
            t0 = time.perf_counter()
            ledger.step_end(step, fetch_seconds=0.001, loss=0.5)
            slowest = max(slowest, time.perf_counter() - t0)
    return time.perf_counter() - start, slowest


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from goodput.bench._callbacks import callback_overheads
    from goodput.errors import ConfigError
    from goodput.ledger import Ledger, LedgerConfig

    if args.report_steps is not None:
        return _report_scale(args)
    if args.steps < 100 or args.size < 1:
        raise ConfigError(f"--steps must be >= 100 and --size >= 1, got {args.steps} and {args.size}")
    a = np.random.default_rng(0).standard_normal((args.size, args.size))

    def work() -> None:
        a @ a

    _loop(min(args.steps, 2000), work, None)  # warm caches and the allocator
    base, _ = _loop(args.steps, work, None)
    print(f"baseline: {args.steps} steps in {base:.3f} s ({1e6 * base / args.steps:.1f} us/step)")
    for fsync in (False, True):
        with tempfile.TemporaryDirectory(prefix="goodput-bench-ledger-") as folder:
            with Ledger(folder, rank=0, config=LedgerConfig(fsync=fsync)) as ledger:
                took, slowest = _loop(args.steps, work, ledger)
            size = ledger.path.stat().st_size
        again, _ = _loop(args.steps, work, None)  # a second baseline: the noise floor of this machine
        per_step = (took - base) / args.steps
        print(
            f"ledger fsync={fsync!s:<5}: {took:.3f} s, overhead {1e6 * per_step:+.1f} us/step "
            f"({per_step / 0.01:.2%} of a 10 ms step), "
            f"ratio {took / base:.3f} (baseline rerun {again / base:.3f}); slowest call {1e3 * slowest:.2f} ms; "
            f"{2 * args.steps + 2} events, {size / 1e6:.1f} MB"
        )
    _print_callbacks(callback_overheads(args.steps))
    return 0


def _print_callbacks(results: dict[str, Any]) -> None:
    for name, r in results.items():
        if isinstance(r, str):
            print(f"{name} callback: {r}")
            continue
        per_step = r["overhead_per_step"]
        print(
            f"{name} callback: {1e6 * per_step:.1f} us/step ({per_step / 0.01:.2%} of a 10 ms step): hooks "
            f"{r['hook_seconds']:.3f} s, loader wrapper {r['wrapper_seconds']:.3f} s"
        )


def _report_scale(args: argparse.Namespace) -> int:
    """Time ``load_report`` on a synthesized ledger per size; print events, seconds and the growth."""
    import shutil

    from goodput.bench._ledger_synth import synthesize
    from goodput.errors import ConfigError
    from goodput.ledger import load_report

    try:
        sizes = sorted({int(part) for part in args.report_steps.split(",") if part.strip()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < args.report_attempts or args.report_attempts < 1 or args.report_ranks < 1:
        raise ConfigError(
            f"--report-steps takes comma-separated step counts of at least --report-attempts "
            f"({args.report_attempts}), got {args.report_steps!r}; --report-ranks must be >= 1"
        )
    print(
        f"goodput report on synthesized ledgers: {args.report_attempts} attempts, {args.report_ranks} ranks"
    )
    print(
        f"{'steps/rank':>12}{'events':>14}{'MB':>9}{'report s':>10}{'s/Mevent':>10}{'x time':>8}{'x events':>9}"
    )
    previous: tuple[float, int] | None = None
    for steps in sizes:
        folder = tempfile.mkdtemp(prefix="goodput-bench-ledger-report-")
        try:
            counts = synthesize(folder, steps=steps, attempts=args.report_attempts, ranks=args.report_ranks)
            start = time.perf_counter()
            report = load_report(folder)
            seconds = time.perf_counter() - start
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if report.accounting.restarts != counts["failures"]:
            raise RuntimeError(
                f"the report counted {report.accounting.restarts} restarts of {counts['failures']}"
            )
        growth = (
            "" if previous is None else f"{seconds / previous[0]:>8.2f}{counts['events'] / previous[1]:>9.2f}"
        )
        print(
            f"{steps:>12,}{counts['events']:>14,}{counts['bytes'] / 1e6:>9.0f}{seconds:>10.2f}"
            f"{seconds / counts['events'] * 1e6:>10.2f}{growth}"
        )
        previous = (seconds, counts["events"])
    return 0
