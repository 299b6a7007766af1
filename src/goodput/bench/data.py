"""Data pipeline: epoch time over the overlap floor, fetch_seconds, and resume cost at sample 1,000,000.

    goodput bench data [--compute 20ms] [--steps 100] [--workers 1] [--repeats 3] [--json]

A synthetic dataset takes L per batch to load (a sleep, as a remote read waits) and a training step takes C (a
sleep, as a host waits for its GPU). Three loaders run the same epoch for L = C/2, L = C and L = 2C:

* sequential: torch's DataLoader without workers (load, then compute);
* dataloader: torch's DataLoader with ``--workers`` persistent workers;
* goodput: ResumableLoader with the same workers, behind a CPU DevicePrefetcher.

The floor is what perfect overlap allows: max(steps x C, steps x L / workers), measured in the same run (the
steps' sleeps alone and the loads' sleeps alone), so sleep overshoot on a busy machine cancels out. The run
has ``--repeats`` rounds of a floor and one epoch per loader; each loader's best epoch is divided by the best
floor (timeit's rule: load from elsewhere only adds time); fetch percentiles cover every round. The first
batch of an epoch cannot overlap anything, so a perfect pipeline sits at 1 + 1/steps of the floor.

Resume in the Hugging Face Trainer (``resume_hf``, needs ``goodput[hf]``; bench/_hf_resume.py): the Trainer's
own skip of the batches already trained against goodput's position, at sample 100,000 of 200,000;
``ratios.hf_skip_resume_over_goodput_resume`` is their quotient.

In-place formats (``--format parquet,arrow,hf,tokens,wds,mds``, needs ``goodput[hf-datasets]`` and, for wds,
``webdataset``; mds runs Mosaic Streaming in the venv of ``goodput bench cache --make-mosaic-venv`` and reports
"peer unavailable" without it; bench/_formats.py): each format's resume and throughput against its native
loader on the same files, instead of the above.

Resume: a loader over 2,000,000 samples restores a position at sample 1,000,000 (JSON text) and takes its
first batch; the same for a loader starting at sample 0 is the baseline. The dataset counts its fetches, so a
replay of consumed batches would show. The same again over 10^4, 10^6 and 10^8 samples, at the middle of each
(``resume_by_size``): the dataset is only a length (its items are their indices, made when fetched), so 10^8
samples cost no storage; the sample order is computed at any position without materialising it
(goodput.data.order), so state and time do not grow with the dataset.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from goodput.errors import ConfigError
from goodput.units import parse_duration

__all__ = ["add_arguments", "run"]

_CASES = (("l_lt_c", 0.5), ("l_eq_c", 1.0), ("l_gt_c", 2.0))
_RESUME_SAMPLES = (10**4, 10**6, 10**8)
_BATCH = 8


class _Synthetic:
    """``n`` samples; loading a batch takes ``load_seconds`` (one ``__getitems__`` call per batch)."""

    def __init__(self, n: int, load_seconds: float) -> None:
        self.n = n
        self.load_seconds = load_seconds
        self.fetches = 0

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: Sequence[int]) -> Any:
        import torch

        self.fetches += 1
        if self.load_seconds:
            time.sleep(self.load_seconds)
        return torch.as_tensor(list(indices))


def _dataset(n: int, load_seconds: float) -> Any:
    return _Synthetic(n, load_seconds)


def _keep(batch: Any) -> Any:
    return batch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compute", default="20ms", help="step compute time C (default 20ms)")
    parser.add_argument("--steps", type=int, default=100, help="steps per timed epoch (default 100)")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers (default 1)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds of a floor and an epoch per loader; the best of each counts (default 3)",
    )
    parser.add_argument(
        "--hf-resume-at",
        type=int,
        default=100_000,
        help="sample at which the HF Trainer resume is measured (default 100000; 0 skips it)",
    )
    parser.add_argument(
        "--format",
        help="comma-separated in-place formats to measure against their native loaders instead "
        "(parquet, arrow, hf, tokens, wds, mds); see bench/_formats.py",
    )
    parser.add_argument("--rows", type=int, default=1_048_576, help="samples written per format (--format)")
    parser.add_argument(
        "--position", type=int, default=1_000_000, help="sample at which resume is measured (--format)"
    )
    parser.add_argument(
        "--epoch-samples", type=int, default=200_000, help="samples timed for throughput (--format)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _epoch(batches: Iterable[Any], compute: float) -> tuple[float, list[float]]:
    """Run one epoch with a step of ``compute`` seconds; return the wall time and each wait for a batch."""
    waits = []
    start = time.perf_counter()
    it = iter(batches)
    while True:
        asked = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        waits.append(time.perf_counter() - asked)
        time.sleep(compute)
    return time.perf_counter() - start, waits


def _floor(steps: int, seconds: float) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        time.sleep(seconds)
    return time.perf_counter() - start


def _percentiles(values: list[float]) -> dict[str, float]:
    import numpy as np

    p50, p95 = np.percentile(values, [50, 95])
    return {"p50": float(p50), "p95": float(p95)}


def _case(load: float, compute: float, steps: int, workers: int, repeats: int) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from goodput.data import DevicePrefetcher, ResumableLoader

    n = steps * _BATCH
    sequential: Any = DataLoader(_dataset(n, load), batch_size=_BATCH, shuffle=True, collate_fn=_keep)
    stock: Any = DataLoader(
        _dataset(n, load),
        batch_size=_BATCH,
        shuffle=True,
        collate_fn=_keep,
        num_workers=workers,
        persistent_workers=True,
    )
    ours = ResumableLoader(
        _Synthetic(n, load), batch_size=_BATCH, collate_fn=_keep, num_workers=workers, persistent_workers=True
    )
    for warm_up in (stock, ours):  # a first epoch starts the workers (kept); time a steady-state epoch
        for _ in warm_up:
            pass
    ours.fetch_seconds.clear()
    runs: dict[str, Callable[[], Iterable[Any]]] = {
        "sequential": lambda: sequential,
        "dataloader": lambda: stock,
        "goodput": lambda: DevicePrefetcher(ours, "cpu"),
    }
    floors: list[float] = []
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    waits: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # rounds: a floor, then one epoch per loader
        floors.append(max(_floor(steps, compute), _floor(steps, load) / workers))
        for name, make in runs.items():
            took, waited = _epoch(make(), compute)
            seconds[name].append(took)
            waits[name] += waited
    waits["goodput"] = ours.fetch_seconds.values  # what the loader itself recorded
    return {  # best of the rounds, for the floor as for the epochs: noise from elsewhere only adds time
        name: {"epoch_over_ideal": min(seconds[name]) / min(floors), **_percentiles(waits[name])}
        for name in runs
    }


def _resume(n: int = 2_000_000, position: int = 1_000_000, repeats: int = 15) -> dict[str, Any]:
    from goodput.data import ResumableLoader

    def first_batch(consumed: int) -> tuple[float, int, int]:
        dataset = _Synthetic(n, 0.0)
        loader = ResumableLoader(dataset, batch_size=32, seed=1, collate_fn=_keep)
        text = json.dumps({**loader.state_dict(), "consumed": consumed})
        start = time.perf_counter()
        loader.load_state_dict(json.loads(text))
        next(iter(loader))
        return time.perf_counter() - start, len(text), dataset.fetches

    resumed, fresh = [], []
    for _ in range(repeats):  # interleaved, so that load from elsewhere hits both alike
        resumed.append(first_batch(position))
        fresh.append(first_batch(0))
    seconds = min(r[0] for r in resumed)
    baseline = min(r[0] for r in fresh)
    return {
        "samples": n,
        "position": position,
        "seconds": seconds,
        "fresh_start_seconds": baseline,
        "over_fresh_start": seconds / baseline,
        "state_bytes": max(r[1] for r in resumed),
        "batches_fetched": max(r[2] for r in resumed),
    }


def _resume_hf(position: int) -> dict[str, Any]:
    from goodput.bench import _hf_resume

    why_not = "--hf-resume-at 0" if position <= 0 else _hf_resume.available()
    return {"skipped": why_not} if why_not else _hf_resume.hf_resume(position)


def _run_formats(args: argparse.Namespace) -> int:
    from goodput.bench import _formats

    names = [n.strip() for n in args.format.split(",") if n.strip()]
    unknown = [n for n in names if n not in _formats.BENCHES]
    if not names or unknown:
        raise ConfigError(
            f"--format takes {', '.join(_formats.BENCHES)} (comma-separated), got {args.format!r}"
        )
    needed = sorted({m for n in names for m in _formats.BENCHES[n].needs})
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"--format {args.format} needs {', '.join(missing)}: pip install them (goodput's extras)"
        )
    if not 0 < args.position < args.rows or not 0 < args.epoch_samples <= args.rows:
        raise ConfigError(
            f"--position ({args.position}) and --epoch-samples ({args.epoch_samples}) must be positive and "
            f"below --rows ({args.rows})"
        )
    report = _formats.run_formats(names, args.rows, args.position, args.epoch_samples)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _formats.print_table(report)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.format is not None:
        return _run_formats(args)
    compute = parse_duration(args.compute, what="--compute")
    if compute <= 0:
        raise ConfigError(f"--compute must be positive, got {args.compute!r}")
    if args.steps < 2:
        raise ConfigError(f"--steps must be at least 2, got {args.steps}")
    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {args.repeats}")
    cases = {
        name: _case(factor * compute, compute, args.steps, args.workers, args.repeats)
        for name, factor in _CASES
    }
    resume = _resume()
    by_size = [_resume(n, n // 2) for n in _RESUME_SAMPLES]
    resume_hf = _resume_hf(args.hf_resume_at)
    report = {
        "config": {
            "compute_seconds": compute,
            "steps": args.steps,
            "workers": args.workers,
            "batch": _BATCH,
            "repeats": args.repeats,
        },
        "ratios": {
            "epoch_over_ideal": {name: c["goodput"]["epoch_over_ideal"] for name, c in cases.items()},
            **({"hf_skip_resume_over_goodput_resume": resume_hf["ratio"]} if "ratio" in resume_hf else {}),
        },
        "fetch_seconds": {name: {k: c["goodput"][k] for k in ("p50", "p95")} for name, c in cases.items()},
        "baselines": {
            loader: {name: c[loader] for name, c in cases.items()} for loader in ("sequential", "dataloader")
        },
        "goodput": {name: c["goodput"] for name, c in cases.items()},
        "resume": resume,
        "resume_by_size": by_size,
        "resume_hf": resume_hf,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report, cases)
    return 0


def _print_table(report: dict[str, Any], cases: dict[str, dict[str, Any]]) -> None:
    cfg = report["config"]
    print(
        f"goodput bench data: C={cfg['compute_seconds'] * 1e3:.0f} ms, {cfg['steps']} steps, "
        f"batch {cfg['batch']}, {cfg['workers']} worker(s), best of {cfg['repeats']} round(s); "
        "epoch time / floor max(steps*C, steps*L/workers)"
    )
    print(f"{'case':8} {'loader':11} {'epoch/floor':>11} {'fetch p50':>10} {'fetch p95':>10}")
    for name, case in cases.items():
        for loader in ("sequential", "dataloader", "goodput"):
            r = case[loader]
            print(
                f"{name:8} {loader:11} {r['epoch_over_ideal']:11.3f} "
                f"{r['p50'] * 1e3:8.2f}ms {r['p95'] * 1e3:8.2f}ms"
            )
    res = report["resume"]
    print(
        f"resume at sample {res['position']:,}: {res['seconds'] * 1e3:.2f} ms to the first batch "
        f"({res['over_fresh_start']:.2f}x a fresh start), state {res['state_bytes']} bytes, "
        f"{res['batches_fetched']} batch fetched"
    )
    for r in report["resume_by_size"]:
        print(
            f"  of {r['samples']:>11,} samples, at {r['position']:>11,}: {r['seconds'] * 1e3:.2f} ms "
            f"({r['over_fresh_start']:.2f}x a fresh start), state {r['state_bytes']} bytes, "
            f"{r['batches_fetched']} batch fetched"
        )
    hf = report["resume_hf"]
    if "skipped" in hf:
        print(f"resume in the HF Trainer: skipped ({hf['skipped']})")
    else:
        print(
            f"resume in the HF Trainer at sample {hf['position']:,}: its skip {hf['hf_skip_seconds'] * 1e3:.1f} ms "
            f"(fresh start {hf['hf_fresh_start_seconds'] * 1e3:.1f} ms), goodput {hf['goodput_seconds'] * 1e3:.2f} ms: "
            f"{hf['ratio']:.0f}x"
        )
