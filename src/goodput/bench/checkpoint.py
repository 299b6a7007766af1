"""Checkpoint cost per strategy under a training-like loop (2 ranks, gloo), against floors measured in the run.

    goodput bench checkpoint                      # 512 MiB of model + AdamW state, FSDP2-sharded over 2 ranks
    goodput bench checkpoint --state-size 64MiB --saves 3 --staging-saves 5 --json    # a quick run
    goodput bench checkpoint --state-size 256MiB,1GiB,2GiB --strategies dcp,dcp_async --no-idle-host --no-s3
                                                  # cost as the state grows: one run per size, one table

It starts itself under torchrun. Each rank runs a loop of fixed compute per step that also changes the weights,
and saves every strategy several times. Per strategy it reports the blocking stall (median), the loop time lost
per save (a window of steps with a save minus the same window without), time until durable, bytes and peak
extra host memory; the floors are a memcpy of the same bytes into preallocated buffers and the fastest durable
write of the same bytes into new files (bench/_durable_write.py). Ratios compare them; read ratios, not
absolute times (the machine is shared). With several sizes, each ratio to a floor is also shown over its value
at the smallest size (bench/_sizes.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from typing import Any

from goodput._env import BENCH_S3_OPTIONS

__all__ = ["add_arguments", "run"]

_GOALS = {
    "torch_save_stall_over_async_stall": ">= 25",
    "async_stall_over_memcpy_floor": "<= 1.3",
    "torch_save_lost_over_async_lost": "report (CPU-bound step)",
    "torch_save_lost_over_async_lost_idle_host": ">= 5",
    "torch_save_lost_over_async_process_lost_idle_host": "report (process checkpointer)",
    "dcp_write_over_raw_write": ">= 0.8",
    "restore_over_read_floor": "<= 1.5",
    "s3_write_over_raw_put": ">= 0.8",
    "s3_restore_over_raw_get": ">= 0.8",
    "run_step_overhead_over_10ms": "<= 0.01",
    "staging_memory_over_state_bytes": "<= 1.1 (flat)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-size",
        default="512MiB",
        help="model + optimizer state in all (default 512MiB); a comma list runs each size in turn",
    )
    parser.add_argument("--saves", type=int, default=4, help="measured saves per strategy (default 4)")
    parser.add_argument("--staging-saves", type=int, default=20, help="async saves for the memory check (20)")
    parser.add_argument(
        "--step-ms", type=float, default=100.0, help="fixed compute per step, ms (default 100)"
    )
    parser.add_argument(
        "--window",
        type=int,
        default=20,
        help="least steps per measured window (default 20; longer when an "
        "async save's background work would outlast it)",
    )
    parser.add_argument("--max-window", type=int, default=200, help="most steps per measured window (200)")
    parser.add_argument(
        "--strategies", default="torch_save,dcp,dcp_async", help="comma list; dcp_async_process adds the "
        "process-based async checkpointer"
    )  # fmt: skip
    parser.add_argument(
        "--checksums",
        choices=("on", "off"),
        default="on",
        help="xxh3_128 of every file, computed while writing (on)",
    )
    parser.add_argument(
        "--no-idle-host", action="store_true", help="skip the idle-host (sleeping step) windows"
    )
    parser.add_argument(
        "--no-s3", action="store_true", help="skip the S3 (SeaweedFS on 127.0.0.1) measurements"
    )
    parser.add_argument("--root", default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


_FLOOR_RATIOS = {  # True: a cost over its floor; False: a floor over its cost
    "async_stall_over_memcpy_floor": True,
    "dcp_write_over_raw_write": False,
    "restore_over_read_floor": True,
    "s3_write_over_raw_put": False,
    "s3_restore_over_raw_get": False,
}


STRATEGIES = ("torch_save", "dcp", "dcp_async", "dcp_async_process")


def run(args: argparse.Namespace) -> int:
    """Launch the measurement under torchrun (once per size) and print what rank 0 reports."""
    from goodput.bench._sizes import parse_sizes, print_results
    from goodput.errors import ConfigError

    sizes = parse_sizes(args.state_size)
    if args.saves < 2 or args.window < 2 or args.nproc < 1:
        raise ConfigError("--saves and --window must be >= 2, --nproc >= 1")
    names = {s.strip() for s in args.strategies.split(",") if s.strip()}
    unknown = sorted(names - set(STRATEGIES))
    if unknown:
        raise ConfigError(f"--strategies: choose from {', '.join(STRATEGIES)}; unknown: {', '.join(unknown)}")
    if not names & {"dcp", "dcp_async"}:
        raise ConfigError(
            "--strategies must include dcp or dcp_async: the restore is timed on its checkpoint"
        )
    results = []
    for size in sizes:
        result = _measure(args, size)
        if result is None:
            return 1
        results.append(result)
        if not args.json:
            _print(result)
    print_results(sizes, results, _FLOOR_RATIOS, as_json=args.json)
    return 0


def _measure(args: argparse.Namespace, state_bytes: int) -> dict[str, Any] | None:
    """One torchrun measurement at ``state_bytes``; None (after one line on stderr) when it failed."""
    with tempfile.TemporaryDirectory(prefix="goodput-bench-ckpt-") as tmp, contextlib.ExitStack() as stack:
        out = os.path.join(tmp, "result.json")
        config = {
            **vars(args),
            "state_bytes": state_bytes,
            "root": args.root or os.path.join(tmp, "ckpt"),
            "out": out,
            "idle_host": not args.no_idle_host,
        }
        config.pop("handler", None)
        env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONWARNINGS": "ignore"}
        if not args.no_s3:
            from goodput.testing import S3Server

            os.makedirs(os.path.join(tmp, "s3"))
            server = stack.enter_context(S3Server(bucket="goodput-bench", data_dir=os.path.join(tmp, "s3")))
            config["s3_root"] = f"s3://{server.bucket}/bench"
            env[BENCH_S3_OPTIONS.name] = json.dumps(server.storage_options())
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.nproc}",
        ]
        cmd += ["-m", "goodput.bench._checkpoint_worker", json.dumps(config)]
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL if args.json else None)
        if done.returncode != 0 or not os.path.exists(out):
            print(
                f"goodput bench checkpoint: the measurement failed (exit {done.returncode})", file=sys.stderr
            )
            return None
        with open(out, encoding="utf-8") as f:
            result: dict[str, Any] = json.load(f)
            return result


def _print(result: dict[str, Any]) -> None:
    print(
        f"state {result['state_bytes'] / 2**20:.0f} MiB over {result['world_size']} ranks; step {result['step_ms']:.0f} ms"
    )
    print(
        f"{'strategy':<18}{'stall med':>10}{'lost/save':>11}{'durable':>9}{'bytes':>10}{'peak extra mem':>16}"
    )
    for name, s in result["strategies"].items():
        print(
            f"{name:<18}{s['stall_s']:>9.3f}s{s['lost_s']:>10.3f}s{s['durable_s']:>8.2f}s"
            f"{s['bytes'] / 2**20:>7.0f}MiB{s['peak_extra_mem_bytes'] / 2**20:>13.0f}MiB"
        )
    floors = result["floors"]
    print(
        f"floors: memcpy {floors['memcpy_s']:.3f}s, durable write {floors['raw_write_s']:.2f}s before each save"
        f" and {floors.get('raw_write_after_s', float('nan')):.2f}s after (drift"
        f" {floors.get('raw_write_drift') or float('nan'):.2f}x) "
        f"({floors.get('raw_write_method') or 'n/a'}; "
        + ", ".join(f"{k} {v:.2f}s" for k, v in floors.get("raw_write_calibration_s", {}).items())
        + ")"
    )
    for name, part in result.get("idle_host", {}).items():
        print(f"idle host {name:<10} stall {part['stall_s']:.3f}s, lost/save {part['lost_s']:.3f}s")
    restore = result.get("restore") or {}
    if restore:
        parts = ", ".join(f"{k} {v:.3f}s" for k, v in restore["parts_s"].items())
        print(f"restore {restore['restore_s']:.3f}s vs raw read {restore['read_floor_s']:.3f}s ({parts})")
    s3 = result.get("s3") or {}
    if s3:
        print(
            f"S3 ({s3['part_bytes'] >> 20} MiB parts, {s3['concurrency']} at once): durable save {s3['durable_s']:.2f}s"
            f" vs raw put {s3['raw_put_s']:.2f}s; restore {s3['restore_s']:.2f}s vs raw get {s3['raw_get_s']:.2f}s"
        )
    run = result.get("run") or {}
    if run:
        print(f"Run per step: {run['per_step_s'] * 1e6:.1f} us ({run['save_decisions']} save decisions)")
    for key, value in result["ratios"].items():
        shown = "n/a" if value is None else f"{value:.2f}"
        print(f"  {key:<36}{shown:>8}   goal {_GOALS.get(key, '')}")


class RssSampler:
    """Peak resident memory of this process, sampled every 2 ms in a thread."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def now(self) -> int:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * self._page

    def _loop(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.now())

    def reset(self) -> int:
        self.peak = self.now()
        return self.peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b > 0 or a != a or b != b:
        return None
    return a / b
