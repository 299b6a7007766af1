"""Remote cache: naive remote reads vs cold and warm epochs through the cache, the local-disk floor, and Mosaic.

    goodput bench cache [--json] [--mosaic-python .venv-mosaic/bin/python]

The same shards sit on a real S3 server (SeaweedFS on 127.0.0.1) behind the fault proxy, which adds a latency
to every request and caps each connection's bandwidth. Measured in one run, each as samples per second over
the same samples in the same order: naive reads (one range request per sample, no cache), a cold epoch through
the cache with prefetch, a warm epoch (new dataset object on the same cache folder), direct reads of the same
shard files from local disk (the floor), and Mosaic Streaming's StreamingDataset over the same samples (MDS
shards of the same size, on the same server, behind the same proxy), cold and warm, and goodput's MDSDataset
reading those same MDS files cold through the cache (``mds_cold``).

Mosaic Streaming runs in its own venv (it needs numpy<2.2 and pins its own cloud SDKs): make it once with
``goodput bench cache --make-mosaic-venv .venv-mosaic`` (about 2.5 min, 1.9 GB). Its torchvision is replaced by
a stand-in, because the PyPI torchvision binary needs CUDA libraries this CPU-only machine lacks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from typing import Any

from goodput.errors import ConfigError
from goodput.units import parse_bytes

__all__ = ["add_arguments", "run"]

_MOSAIC_SCRIPT = os.path.join(os.path.dirname(__file__), "_mosaic_epoch.py")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=6400, help="samples in the dataset (default 6400)")
    parser.add_argument("--sample-size", default="32KiB", help="bytes per sample (default 32KiB)")
    parser.add_argument("--shard-size", default="16MiB", help="bytes per shard (default 16MiB)")
    parser.add_argument("--latency", type=float, default=0.03, help="seconds added to each request (0.03)")
    parser.add_argument("--bandwidth", default="16MB", help="per-connection cap per second (16MB; 0B: none)")
    parser.add_argument(
        "--link-bandwidth", default="0B", help="cap per second on all connections together (default 0B: none)"
    )
    parser.add_argument("--naive-seconds", type=float, default=5.0, help="time spent on naive reads (5)")
    parser.add_argument(
        "--mosaic-python",
        default=os.environ.get("GOODPUT_MOSAIC_PYTHON", os.path.join(".venv-mosaic", "bin", "python")),
        help="python of the Mosaic Streaming venv (default $GOODPUT_MOSAIC_PYTHON or .venv-mosaic/bin/python); "
        "skipped when missing",
    )
    parser.add_argument("--make-mosaic-venv", metavar="DIR", help="create the Mosaic Streaming venv and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    if args.make_mosaic_venv:
        from goodput.bench._mosaic_venv import make_mosaic_venv

        make_mosaic_venv(args.make_mosaic_venv)
        return 0
    sample_bytes = parse_bytes(args.sample_size, what="--sample-size")
    shard_bytes = parse_bytes(args.shard_size, what="--shard-size")
    bandwidth = parse_bytes(args.bandwidth, what="--bandwidth")
    link_bandwidth = parse_bytes(args.link_bandwidth, what="--link-bandwidth")
    if args.samples < 10 or sample_bytes < 1 or shard_bytes < sample_bytes:
        raise ConfigError("need --samples >= 10 and --shard-size >= --sample-size > 0")
    from goodput.bench._cache_run import measure

    with tempfile.TemporaryDirectory(prefix="goodput-bench-cache-") as work:
        results = measure(
            work,
            samples=args.samples,
            sample_bytes=sample_bytes,
            shard_bytes=shard_bytes,
            latency=args.latency,
            bandwidth=bandwidth,
            link_bandwidth=link_bandwidth,
            naive_seconds=args.naive_seconds,
            mosaic_python=args.mosaic_python if os.path.exists(args.mosaic_python) else None,
        )
    _report(results, args)
    return 0


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _report(results: dict[str, Any], args: argparse.Namespace) -> None:
    rate = results["samples_per_second"]
    ratios = {
        "warm_over_local_floor": _ratio(rate["warm"], rate["local_floor"]),
        "cold_over_mosaic_cold": _ratio(rate["cold"], rate.get("mosaic_cold")),
        "mds_cold_over_mosaic_cold": _ratio(rate.get("mds_cold"), rate.get("mosaic_cold")),
        "warm_over_mosaic_warm": _ratio(rate["warm"], rate.get("mosaic_warm")),
        "cold_over_naive": _ratio(rate["cold"], rate["naive"]),
    }
    results["ratios"] = ratios
    if args.json:
        print(json.dumps(results))
        return
    setup = results["setup"]
    caps = [f"{setup['latency_s'] * 1000:.0f} ms per request"]
    if setup["bandwidth_bps"]:
        caps.append(f"{setup['bandwidth_bps'] / 1e6:.0f} MB/s per connection")
    if setup["link_bandwidth_bps"]:
        caps.append(f"{setup['link_bandwidth_bps'] / 1e6:.0f} MB/s for all connections")
    print(
        f"{setup['samples']} samples x {setup['sample_bytes']} B in {setup['shards']} shards; proxy: {', '.join(caps)}"
    )
    for name, value in rate.items():
        shown = "skipped" if value is None else f"{value:12.1f} samples/s"
        print(f"  {name:<12} {shown}")
    if results.get("mosaic_note"):
        print(f"  mosaic: {results['mosaic_note']}")
    for name, value in ratios.items():
        print(f"  {name:<24} {'n/a' if value is None else f'{value:.2f}x'}")


def time_call(fn: Any) -> float:
    """Seconds ``fn()`` took."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def python_for_mosaic(path: str) -> list[str]:
    return [path, _MOSAIC_SCRIPT]


def run_mosaic(python: str, argv: list[str], env: dict[str, str]) -> str:
    """Run the Mosaic side in its venv; returns its stdout (raises with its stderr tail on failure)."""
    done = subprocess.run(
        [*python_for_mosaic(python), *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"Mosaic Streaming step {argv[0]} failed: {done.stderr[-1500:]}")
    return done.stdout
