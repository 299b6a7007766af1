"""Recovery with the memory tier: save stall, restore time and lost work against floors and the durable tier.

    goodput bench recovery                          # 256 MiB of model + AdamW state per rank, 2 ranks
    goodput bench recovery --state-size 64MiB --steps 40 --no-node-loss --json     # a quick run
    goodput bench recovery --state-size 128MiB,512MiB,1GiB     # cost as the state grows (costs only, one table)

It starts itself under torchrun (2 ranks, gloo) beside a real S3 server (SeaweedFS on 127.0.0.1) behind
goodput's fault proxy with ``bench cache``'s default latency (30 ms a request) and bandwidth (16 MB/s a
connection), which holds the durable tier. Measured in one run:

- the blocking part of a memory-tier save, and the time to load the newest memory checkpoint into the live
  state, against a copy of the same bytes into preallocated buffers (the memcpy floor), made by every rank at
  once like the saves and restores; the restore's floor is measured again just before each restore (the median
  of those; ``memory_restore_over_start_floor`` divides by the first one instead);
- restoring the same step from the durable tier (dcp_async on S3) against restoring it from memory;
- steps re-done per failure: the same loop (fixed step time, ``auto`` cadences, the planner fed ``--mtbf``) with
  the memory tier and without it, and the same failure times drawn over it; a failure re-does every step after
  the newest step committed (memory or durable) at that moment;
- a node loss on a two-agent job (``--nnodes 2`` on this machine): the tier it restored from and whether the
  resumed run is bitwise identical to an uninterrupted one (``goodput verify-resume``'s comparison).

With several sizes (a comma list), each size runs the first two parts only (save stall, restores), the
resident memory the memory saves add is measured against the state, and one table shows each ratio to its
floor over its value at the smallest size (bench/_sizes.py).

Read ratios, not absolute times: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

__all__ = ["add_arguments", "run"]

_GOALS = {
    "memory_stall_over_memcpy_floor": "<= 1.5",
    "memory_restore_over_memcpy_floor": "<= 2",
    "durable_restore_over_memory_restore": ">= 10",
    "lost_steps_per_failure": "<= 2",
    "durable_only_over_memory_lost_steps": "(the ratio)",
    "staging_memory_over_state_bytes": "<= 1.1 (private memory the memory saves add)",
    "memory_tier_over_state_bytes": "report (the tier's RAM files: the newest step and the one being written)",
}
_BUCKET = "goodput-bench-recovery"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-size",
        default="256MiB",
        help="model + optimizer state per rank (256MiB); a comma list runs each size in turn (costs only)",
    )
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--saves", type=int, default=4, help="memory-tier saves measured (default 4)")
    parser.add_argument("--steps", type=int, default=40, help="steps of each lost-work loop (default 40)")
    parser.add_argument("--step-ms", type=float, default=1000.0, help="compute per step, ms (default 1000)")
    parser.add_argument("--mtbf", type=float, default=60.0, help="seconds between failures for auto (60)")
    parser.add_argument("--failures", type=int, default=200, help="failure times drawn over the loops (200)")
    parser.add_argument("--latency", type=float, default=0.03, help="proxy latency per request, s (0.03)")
    parser.add_argument("--bandwidth", default="16MB", help="proxy cap per connection per second (16MB)")
    parser.add_argument("--no-node-loss", action="store_true", help="skip the two-agent node-loss run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the failure times (0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


_FLOOR_RATIOS = {"memory_stall_over_memcpy_floor": True, "memory_restore_over_memcpy_floor": True}


def run(args: argparse.Namespace) -> int:
    """Start the S3 server and proxy, measure under torchrun (once per size), run the node loss, print ratios."""
    from goodput.bench._sizes import parse_sizes, print_results
    from goodput.errors import ConfigError
    from goodput.units import parse_bytes

    sizes = parse_sizes(args.state_size)
    bandwidth = parse_bytes(args.bandwidth, what="--bandwidth")
    if args.saves < 2 or args.steps < 10 or args.nproc < 1 or args.mtbf <= 0:
        raise ConfigError("--saves must be >= 2, --steps >= 10, --nproc >= 1, --mtbf > 0")
    several = len(sizes) > 1
    results = []
    for size in sizes:
        result = _measure(args, size, bandwidth, loops=not several)
        if result is None:
            return 1
        result["ratios"] = _ratios(result)
        results.append(result)
        if not args.json:
            _print(result)
    print_results(sizes, results, _FLOOR_RATIOS, as_json=args.json)
    return 0


def _measure(
    args: argparse.Namespace, state_bytes: int, bandwidth: int, *, loops: bool
) -> dict[str, Any] | None:
    """One measurement at ``state_bytes`` per rank; None (after one line on stderr) when it failed."""
    from goodput.bench._cache_run import _start_proxy
    from goodput.testing import S3Server

    ram = "/dev/shm" if os.path.isdir("/dev/shm") else None  # the memory tier belongs on a RAM file system
    with (
        tempfile.TemporaryDirectory(prefix="goodput-bench-recovery-") as tmp,
        tempfile.TemporaryDirectory(prefix="goodput-bench-recovery-", dir=ram) as shm,
    ):
        out = os.path.join(tmp, "result.json")
        with S3Server(bucket=_BUCKET) as server:
            proxy, port = _start_proxy(server.s3_port, args.latency, bandwidth, 0)
            try:
                options = server.storage_options()
                options["client_kwargs"] = dict(
                    options["client_kwargs"], endpoint_url=f"http://127.0.0.1:{port}"
                )
                config = {
                    "state_bytes": state_bytes, "saves": args.saves, "steps": args.steps, "step_ms": args.step_ms,
                    "mtbf": args.mtbf, "failures": args.failures, "seed": args.seed, "out": out,
                    "root": f"s3://{_BUCKET}/run", "storage_options": options,
                    "memory_folder": os.path.join(shm, "memory"), "loops": loops,
                }  # fmt: skip
                code = _torchrun(config, args.nproc, quiet=args.json)
            finally:
                proxy.kill()
                proxy.wait()
        if code != 0 or not os.path.exists(out):
            print(f"goodput bench recovery: the measurement failed (exit {code})", file=sys.stderr)
            return None
        with open(out, encoding="utf-8") as f:
            result: dict[str, Any] = json.load(f)
        result["setup"] = {"latency_s": args.latency, "bandwidth_bps": bandwidth, "step_ms": args.step_ms,
                           "mtbf_s": args.mtbf, "steps": args.steps}  # fmt: skip
        result["node_loss"] = None if args.no_node_loss or not loops else _node_loss(tmp)
    return result


def _torchrun(config: dict[str, Any], nproc: int, *, quiet: bool) -> int:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += ["-m", "goodput.bench._recovery_worker", json.dumps(config)]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL if quiet else None).returncode


def _node_loss(work: str) -> dict[str, Any]:
    """A two-agent demo job that loses node 1 at step 21, against the same job uninterrupted."""
    from concurrent.futures import ThreadPoolExecutor

    from goodput.demo.verify_train import prepare_data, train
    from goodput.ledger import read_events
    from goodput.testing import free_port
    from goodput.verify.demo import first_difference, read_run

    data = prepare_data(work)
    common: dict[str, Any] = {"data": data, "nproc": 1, "steps": 40, "every": 8, "strategy": "dcp_async",
                              "seed": 0, "memory_every": "2"}  # fmt: skip
    clean = os.path.join(work, "node-loss-reference")
    lost = os.path.join(work, "node-loss")
    runs = {clean: "", lost: "nodeloss@step=21,node=1"}
    for run_dir, plan in runs.items():
        endpoint = f"127.0.0.1:{free_port()}"
        node: dict[str, Any] = {
            "nnodes": 2,
            "rdzv_endpoint": endpoint,
            "max_restarts": 2 if plan else 0,
            "faults": plan,
        }
        with ThreadPoolExecutor(2) as pool:
            statuses = [f.result() for f in [pool.submit(train, run_dir, **common, **node) for _ in range(2)]]
        if statuses != [0, 0]:
            return {"error": f"the {'node-loss' if plan else 'reference'} job exited {statuses}"}
    restores = [e for e in read_events(lost) if e["event"] == "checkpoint_restored"]
    difference = first_difference(read_run(clean), read_run(lost))
    return {
        "restored_from": restores[-1]["tier"] if restores else None,
        "restored_step": restores[-1]["step"] if restores else None,
        "bitwise_identical": difference is None,
        "difference": difference,
    }


def _ratio(a: Any, b: Any) -> float | None:
    return (
        float(a) / float(b) if isinstance(a, int | float) and isinstance(b, int | float) and b > 0 else None
    )


def _ratios(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "memory_stall_over_memcpy_floor": _ratio(r["memory_stall_s"], r["memcpy_floor_s"]),
        "memory_restore_over_memcpy_floor": _ratio(
            r["memory_restore_s"], r.get("memcpy_floor_at_restore_s", r["memcpy_floor_s"])
        ),
        "memory_restore_over_start_floor": _ratio(r["memory_restore_s"], r["memcpy_floor_s"]),
        "durable_restore_over_memory_restore": _ratio(r["durable_restore_s"], r["memory_restore_s"]),
        "lost_steps_per_failure": r["lost_steps_per_failure"],
        "lost_steps_per_failure_durable_only": r["lost_steps_per_failure_durable_only"],
        "durable_only_over_memory_lost_steps": _ratio(
            r["lost_steps_per_failure_durable_only"], r["lost_steps_per_failure"]
        ),
        "staging_memory_over_state_bytes": _ratio(
            r.get("memory_staging_peak_bytes"), r["state_bytes_per_rank"]
        ),
        "memory_tier_over_state_bytes": _ratio(r.get("memory_tier_peak_bytes"), r["state_bytes_per_rank"]),
        "node_loss": r["node_loss"],
    }


def _print(r: dict[str, Any]) -> None:
    print(f"state {r['state_bytes_per_rank'] / 2**20:.0f} MiB per rank x {r['world_size']} ranks; durable tier on"
          f" SeaweedFS behind the fault proxy ({r['setup']['latency_s'] * 1000:.0f} ms,"
          f" {r['setup']['bandwidth_bps'] / 1e6:.0f} MB/s a connection)")  # fmt: skip
    print(f"memcpy floor {r['memcpy_floor_s']:.3f}s  memory stall {r['memory_stall_s']:.3f}s  memory restore"
          f" {r['memory_restore_s']:.3f}s  durable restore {r['durable_restore_s']:.2f}s")  # fmt: skip
    auto = r.get("auto_memory") or {}
    if auto:
        print("memory tier at auto in the lost-work loop: " + ", ".join(
            f"{k.removeprefix('memory_')} {'n/a' if v is None else f'{v:.3f}s'}" for k, v in auto.items()))  # fmt: skip
    for key, value in r["ratios"].items():
        if key == "node_loss":
            continue
        shown = "n/a" if value is None else f"{value:.2f}"
        print(f"  {key:<40}{shown:>8}   goal {_GOALS.get(key, '')}")
    print(
        f"  node_loss  {json.dumps(r['ratios']['node_loss'])}   goal restored_from 'peer', bitwise_identical true"
    )
