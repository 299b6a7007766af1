"""The ledger's cost to a training loop: per-step overhead and the slowest ledger call, against no ledger.

    goodput bench ledger --steps 20000
    goodput bench ledger --report-steps 100000,1000000,10000000 --report-dir /tmp/goodput-ledger-scale

Runs the same small CPU step (a matrix product) N times without a ledger, then with one (step_start and
step_end with fetch time and loss on every step, the background flush every 0.5 s, with and without fsync),
and prints the overhead per step, the ratio of loop times, and the slowest single ledger call: a call that
waited on the disk would show here as milliseconds. Each ledger runs twice: as it writes steps now (records)
and as it wrote them before (JSON lines, bench/_ledger_json.py), and the ratio of the two is printed.

Then the Lightning and Hugging Face callbacks (goodput.integrations), when those packages are installed: their
per-step hooks, each call timed, and their loader wrapper against the bare loader (bench/_callbacks.py).

With ``--report-steps``, instead: the time ``goodput report`` takes (``load_report``: reading every rank's
files and accounting) on a synthesized ledger (bench/_ledger_synth.py) of each number of steps per rank, with
``--report-attempts`` attempts and ``--report-ranks`` ranks and a checkpoint every ``--report-every`` steps,
and each time over the previous size's beside the ratio of their events: linear in events when the time grows
no faster. The ledger is written as the ledger writes it (steps as records; the ranks above 0 with sparse step
files, see the synthesizer), and the baseline is a ``--report-baseline`` steps ledger written in the older
format (steps as JSON lines) and reported by the same code, beside the same ledger as records. Last, the time
per event at the largest size over the smallest's (at most 1: linear) and the largest ledger's report time
(10^7 steps of 0.25 s: a 29-day run). Each ledger of records is also reported without its attempts' indexes
(:mod:`goodput.ledger.index`; a copy of hard links to every other file, as a ledger written before them), which
reads every rank's files: that time, the ratio, and a check that both reports are equal. ``--report-dir`` keeps
the synthesized ledgers and reuses them: the largest takes longer to write than to report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
    parser.add_argument(
        "--report-baseline",
        type=int,
        default=10_000,
        help="steps per rank of the baseline: that ledger in the older format (steps as JSON lines; 0: none)",
    )
    parser.add_argument(
        "--report-dir",
        help="keep the synthesized ledgers in this folder and reuse them on the next run (default: a temporary "
        "folder, removed after each report)",
    )
    parser.add_argument(
        "--report-every",
        type=int,
        default=2400,
        help="steps between checkpoints (2400: 10 min of 0.25 s steps)",
    )


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
    from goodput.bench._ledger_json import JsonStepsLedger
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
        took: dict[str, float] = {}
        for kind, make in (("records", Ledger), ("json", JsonStepsLedger)):
            with tempfile.TemporaryDirectory(prefix="goodput-bench-ledger-") as folder:
                with make(folder, rank=0, config=LedgerConfig(fsync=fsync)) as ledger:
                    took[kind], slowest = _loop(args.steps, work, ledger)
                size = sum(f.stat().st_size for f in ledger.path.parent.iterdir())  # the JSONL and the steps
            again, _ = _loop(args.steps, work, None)  # a second baseline: the noise floor of this machine
            per_step = (took[kind] - base) / args.steps
            print(
                f"ledger fsync={fsync!s:<5} steps as {kind:<7}: {took[kind]:.3f} s, overhead "
                f"{1e6 * per_step:+.1f} us/step ({per_step / 0.01:.2%} of a 10 ms step), ratio "
                f"{took[kind] / base:.3f} (baseline rerun {again / base:.3f}); slowest call "
                f"{1e3 * slowest:.2f} ms; {2 * args.steps + 2} events, {size / 1e6:.1f} MB"
            )
        print(
            f"ledger fsync={fsync!s:<5} records / json lines: loop {took['records'] / took['json']:.3f}, "
            f"overhead per step {(took['records'] - base) / (took['json'] - base):.3f}"
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
    from goodput.bench._ledger_synth import STEP_SECONDS
    from goodput.errors import ConfigError

    try:
        sizes = sorted({int(part) for part in args.report_steps.split(",") if part.strip()})
    except ValueError:
        sizes = []
    if (
        not sizes
        or sizes[0] < args.report_attempts
        or args.report_attempts < 1
        or args.report_ranks < 1
        or args.report_every < 1
    ):
        raise ConfigError(
            f"--report-steps takes comma-separated step counts of at least --report-attempts "
            f"({args.report_attempts}), got {args.report_steps!r}; --report-ranks and --report-every must be >= 1"
        )
    print(
        f"goodput report on synthesized ledgers: {args.report_attempts} attempts, {args.report_ranks} ranks, "
        f"a checkpoint every {args.report_every} steps of 0.25 s"
    )
    print(
        f"{'steps/rank':>12}{'format':>8}{'events':>14}{'MB disk':>9}{'synth s':>9}{'report s':>10}"
        f"{'us/event':>10}{'x time':>8}{'x events':>9}"
    )
    if args.report_baseline:
        base = _time_report(args, args.report_baseline, json_steps=True)
        same = _time_report(args, args.report_baseline, json_steps=False)
        _row(args.report_baseline, "json", base, None)
        _row(args.report_baseline, "records", same, None)
        print(f"{'':>12}records / json: {same[0] / base[0]:.3f} of the time")
    previous: tuple[float, int] | None = None
    rows = []
    for steps in sizes:
        result = _time_report(args, steps, json_steps=False)
        _row(steps, "records", result, previous)
        previous = result[0], result[1]["events"]
        rows.append((steps, result))
    (small, first), (large, last) = rows[0], rows[-1]
    per_event = [seconds / counts["events"] for seconds, counts, _, _ in (first, last)]
    print(
        f"time per event at {large:,} steps / at {small:,}: {per_event[1] / per_event[0]:.3f} "
        "(at most 1: linear in events or better)"
    )
    days = large * STEP_SECONDS / 86400
    print(
        f"report of the largest ledger ({large:,} steps of {STEP_SECONDS} s = {days:.1f} days, "
        f"{args.report_attempts} attempts, {args.report_ranks} ranks): {last[0]:.2f} s; without its indexes "
        f"{last[3]:.2f} s"
    )
    return 0


def _time_report(
    args: argparse.Namespace, steps: int, *, json_steps: bool
) -> tuple[float, dict[str, int], float, float | None]:
    """(report seconds, the ledger's counts, synthesis seconds, report seconds without the indexes: None for
    the older format, which has none) for one synthesized ledger, removed after unless kept."""
    from goodput.bench._ledger_synth import synthesize
    from goodput.ledger.report import load_report

    name = (
        f"steps-{steps}.attempts-{args.report_attempts}.ranks-{args.report_ranks}.every-{args.report_every}"
    )
    kept = args.report_dir is not None
    folder = os.path.join(args.report_dir, name + (".json" if json_steps else "")) if kept else None
    folder = folder or tempfile.mkdtemp(prefix="goodput-bench-ledger-report-")
    marker = os.path.join(folder, "counts.json")  # written last: the ledger there is whole
    try:
        start = time.perf_counter()
        if kept and os.path.exists(marker):
            with open(marker) as f:
                counts = json.load(f)
        else:
            shutil.rmtree(folder, ignore_errors=True)
            counts = synthesize(
                folder,
                steps=steps,
                attempts=args.report_attempts,
                ranks=args.report_ranks,
                every=args.report_every,
                json_steps=json_steps,
                sparse=not json_steps,
            )
            with open(marker, "w") as f:
                json.dump(counts, f)
        made = time.perf_counter() - start
        start = time.perf_counter()
        report = load_report(folder)
        seconds = time.perf_counter() - start
        files = None if json_steps else _against_every_file(folder, report)
    finally:
        if not kept:
            shutil.rmtree(folder, ignore_errors=True)
    if report.accounting.restarts != counts["failures"]:
        raise RuntimeError(
            f"the report counted {report.accounting.restarts} restarts of {counts['failures']}"
        )
    return seconds, counts, made, files


def _against_every_file(folder: str, report: Any) -> float:
    """Seconds to report the same ledger without its indexes (hard links to every other file: a ledger written
    before them), which reads every rank's files; fails unless the two reports are equal."""
    from goodput.ledger.index import INDEX_SUFFIX
    from goodput.ledger.report import load_report

    bare = folder.rstrip(os.sep) + ".without-index"
    shutil.rmtree(bare, ignore_errors=True)
    os.makedirs(os.path.join(bare, "ledger"))
    with os.scandir(os.path.join(folder, "ledger")) as entries:
        for entry in entries:
            if not entry.name.endswith(INDEX_SUFFIX):
                os.link(entry.path, os.path.join(bare, "ledger", entry.name))
    try:
        start = time.perf_counter()
        files = load_report(bare)
        took = time.perf_counter() - start
    finally:
        shutil.rmtree(bare, ignore_errors=True)
    if files.to_dict() | {"run_dir": ""} != report.to_dict() | {"run_dir": ""}:
        raise RuntimeError(f"{folder}: the report through the indexes differs from the report of every file")
    return took


def _row(
    steps: int,
    kind: str,
    result: tuple[float, dict[str, int], float, float | None],
    previous: tuple[float, int] | None,
) -> None:
    seconds, counts, made, files = result
    growth = (
        "" if previous is None else f"{seconds / previous[0]:>8.2f}{counts['events'] / previous[1]:>9.2f}"
    )
    print(
        f"{steps:>12,}{kind:>8}{counts['events']:>14,}{counts['bytes'] / 1e6:>9.0f}{made:>9.1f}{seconds:>10.2f}"
        f"{seconds / counts['events'] * 1e6:>10.3f}{growth}"
    )
    if files is not None:
        print(f"{'':>12}the same ledger without its indexes (every rank's files read): {files:.2f} s; "
              f"with / without: {seconds / files:.3f}, the same report")  # fmt: skip
