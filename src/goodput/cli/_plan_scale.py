"""``goodput plan --cluster-gpus``: goodput at cluster scale for the baseline and goodput's tiers.

    goodput plan --cluster-gpus 1024 16384 100000 --state-per-gpu 4GB --host-bandwidth 50GB \\
        --storage-bandwidth 2TB --plot scale.png

The costs are the floors at the stated bandwidths times what goodput's benchmarks measured against the same
floors (goodput.planning._scale); the failure rate is Llama 3's 8.6 a day on 16,384 GPUs scaled per GPU unless
``--failures-per-day`` (with ``--observed-gpus``) says otherwise. docs/scale.md explains the defaults.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from goodput.cli._plan_plot import short_duration
from goodput.errors import ConfigError
from goodput.planning._scale import (
    LLAMA3_FAILURES_PER_DAY,
    LLAMA3_GPUS,
    STRATEGIES,
    Cluster,
    MeasuredRatios,
    cluster_goodput,
)
from goodput.units import parse_bytes, parse_duration

__all__ = ["add_arguments", "run_scale"]

_LABELS = {
    "baseline": "baseline: sync DCP to storage, cold restart",
    "durable_async": "goodput: async DCP, cold restart",
    "memory_cold": "goodput: memory tier + async DCP, cold restart",
    "memory_warm": "goodput: memory tier + async DCP, warm restart",
}
_DEFAULT_COLD_RESTART = "5m"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "cluster scale (give --cluster-gpus; failures default to Llama 3's 8.6 a day on 16,384 GPUs)"
    )
    group.add_argument("--cluster-gpus", nargs="+", type=int, metavar="N", help="cluster sizes to project")
    group.add_argument("--state-per-gpu", default="4GB", metavar="SIZE",
                       help="checkpointed state per GPU (default 4GB: Llama 3's largest)")  # fmt: skip
    group.add_argument("--host-bandwidth", default="50GB", metavar="SIZE",
                       help="device-to-host copy per GPU, per second (default 50GB: PCIe Gen5 x16)")  # fmt: skip
    group.add_argument("--peer-bandwidth", default="50GB", metavar="SIZE",
                       help="one GPU's network share to a peer node, per second (default 50GB: 400 Gb/s)")  # fmt: skip
    group.add_argument("--storage-bandwidth", default="2TB", metavar="SIZE",
                       help="aggregate checkpoint storage, per second (default 2TB: Llama 3's)")  # fmt: skip


def _cluster(args: argparse.Namespace) -> Cluster:
    if args.afr is not None or args.gpus is not None:
        raise ConfigError(
            "--cluster-gpus takes its failure rate from --failures-per-day (and --observed-gpus), not "
            "--gpus/--afr"
        )
    if any(n < 1 for n in args.cluster_gpus):
        raise ConfigError(f"--cluster-gpus must be >= 1, got {args.cluster_gpus}")
    restart = args.restart if parse_duration(args.restart, what="--restart") > 0 else _DEFAULT_COLD_RESTART
    return Cluster(
        state_per_gpu=parse_bytes(args.state_per_gpu, what="--state-per-gpu"),
        host_bandwidth=parse_bytes(args.host_bandwidth, what="--host-bandwidth"),
        peer_bandwidth=parse_bytes(args.peer_bandwidth, what="--peer-bandwidth"),
        storage_bandwidth=parse_bytes(args.storage_bandwidth, what="--storage-bandwidth"),
        cold_restart=parse_duration(restart, what="--restart") + parse_duration(args.detect, what="--detect"),
        failures_per_day=LLAMA3_FAILURES_PER_DAY if args.failures_per_day is None else args.failures_per_day,
        observed_gpus=LLAMA3_GPUS if args.observed_gpus is None else args.observed_gpus,
        node_loss_share=args.node_loss_share,
    )


def scale_table(cluster: Cluster, gpus: list[int], ratios: MeasuredRatios | None = None) -> dict[str, Any]:
    """Every strategy at every size, as a JSON-able dict (seconds, fractions)."""
    ratios = ratios or MeasuredRatios()
    rows = []
    for n in gpus:
        for strategy in STRATEGIES:
            point = cluster_goodput(n, cluster, ratios, strategy)
            rows.append({
                "gpus": n, "strategy": strategy, "goodput": point.goodput, "mtbf_seconds": point.mtbf,
                "stall_seconds": point.stall, "persist_seconds": point.persist, "restart_seconds": point.restart,
                "interval_seconds": point.interval, "memory": point.memory,
            })  # fmt: skip
    return {"cluster": vars(cluster), "ratios": vars(ratios), "rows": rows}


def _lines(table: dict[str, Any]) -> list[str]:
    c = table["cluster"]
    out = [
        f"state {c['state_per_gpu'] / 1e9:g} GB per GPU; device-to-host {c['host_bandwidth'] / 1e9:g} GB/s, peer "
        f"{c['peer_bandwidth'] / 1e9:g} GB/s per GPU; storage {c['storage_bandwidth'] / 1e12:g} TB/s in all; "
        f"cold restart {short_duration(c['cold_restart'])}; {c['failures_per_day']:g} failures a day on "
        f"{c['observed_gpus']:,} GPUs, scaled per GPU",
        f"{'GPUs':>7}  {'MTBF':>6}  {'strategy':<48}{'goodput':>8}  {'stall':>7}  {'durable':>7}  {'restart':>7}",
    ]
    for row in table["rows"]:
        restart = row["memory"].get("restart", row["restart_seconds"])
        out.append(
            f"{row['gpus']:>7,}  {short_duration(row['mtbf_seconds']):>6}  {_LABELS[row['strategy']]:<48}"
            f"{row['goodput'] * 100:>7.1f}%  {short_duration(row['stall_seconds']):>7}  "
            f"{short_duration(row['persist_seconds'] or row['stall_seconds']):>7}  {short_duration(restart):>7}"
        )
    return out


def plot_scale(table: dict[str, Any], path: str) -> None:
    """Goodput against the cluster size, one line per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for strategy in STRATEGIES:
        rows = [r for r in table["rows"] if r["strategy"] == strategy]
        ax.plot([r["gpus"] for r in rows], [100 * r["goodput"] for r in rows], "o-", label=_LABELS[strategy])
    ax.set_xscale("log")
    ax.set_xlabel("GPUs (failures scale per GPU)")
    ax.set_ylabel("goodput, %")
    ax.set_title("Goodput at cluster scale (goodput plan --cluster-gpus)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_scale(args: argparse.Namespace) -> int:
    """Print (or write as JSON) the projection; draw it with ``--plot``."""
    table = scale_table(_cluster(args), sorted(set(args.cluster_gpus)))
    if args.plot:
        plot_scale(table, args.plot)
    if args.json:
        print(json.dumps(table, indent=1))
    else:
        print("\n".join(_lines(table)))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0
