"""The two-level (memory + durable tier) section of ``goodput plan``: flags, JSON and text.

    goodput plan --failures-per-day 2 --days 30 --ckpt-stall 20s --persist 2m --restart 2m \\
        --memory-stall 50ms --memory-persist 0.5s --node-loss-share 0.3 --simulate 300
"""

from __future__ import annotations

import argparse
from typing import Any

from goodput.cli._plan_plot import short_duration
from goodput.errors import ConfigError
from goodput.planning.model import DAY, PlanInputs
from goodput.planning.twolevel import TwoLevelCosts, durable_share, plan_two_level, simulate_two_level
from goodput.units import parse_duration

__all__ = ["add_arguments", "two_level_lines", "two_level_section"]

_MAX_SIM_INTERVALS = 20_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "memory tier (two-level checkpointing; give --memory-stall to plan it beside the durable tier)"
    )
    group.add_argument("--memory-stall", metavar="DUR", help="training blocked per memory-tier save (C1)")
    group.add_argument(
        "--memory-persist", default="0s", metavar="DUR", help="memory save written+replicated (W1)"
    )
    group.add_argument(
        "--memory-restore", default=None, metavar="DUR", help="restart from memory (default: --restart)"
    )
    group.add_argument("--node-loss-share", type=float, default=0.3, metavar="S",
                       help="share of failures that lose a node's RAM (default 0.3)")  # fmt: skip
    group.add_argument(
        "--no-replicas", action="store_true", help="the memory tier keeps no copy on a peer node"
    )


def two_level_section(
    args: argparse.Namespace, inputs: PlanInputs, *, simulate: int | None, seed: int
) -> dict[str, Any] | None:
    """The two-level plan as a JSON-able dict (seconds), or None without ``--memory-stall``."""
    if args.memory_stall is None:
        return None
    if not 0.0 <= args.node_loss_share <= 1.0:
        raise ConfigError(f"--node-loss-share must be between 0 and 1, got {args.node_loss_share}")
    c1 = parse_duration(args.memory_stall, what="--memory-stall")
    w1 = parse_duration(args.memory_persist, what="--memory-persist")
    r1 = (
        parse_duration(args.memory_restore, what="--memory-restore")
        if args.memory_restore
        else inputs.restart
    )
    share = durable_share(args.node_loss_share, replicated=not args.no_replicas)
    costs = TwoLevelCosts(
        c1=c1, w1=w1, c2=inputs.ckpt_stall, w2=inputs.persist, mtbf=inputs.mtbf, share=share, r1=r1,
        r2=inputs.restart, detect=inputs.detect,
    )  # fmt: skip
    plan = plan_two_level(costs)
    out: dict[str, Any] = {"durable_share": share, **plan.to_dict()}
    if simulate is not None:
        assert inputs.days is not None  # run() asks for --days with --simulate
        intervals = max(1, min(_MAX_SIM_INTERVALS, round(inputs.days * DAY / plan.memory_interval)))
        mean, stderr = simulate_two_level(
            costs, intervals=intervals, tau1=plan.memory_interval, every=plan.durable_every, runs=simulate,
            seed=seed,
        )  # fmt: skip
        out["simulated"] = {"goodput_mean": mean, "goodput_stderr": stderr, "intervals": intervals}
    return out


def two_level_lines(section: dict[str, Any]) -> list[str]:
    """The text ``goodput plan`` prints for the two-level section."""
    durable = (
        f"every {int(section['durable_every'])} memory saves ({short_duration(section['durable_interval'])})"
        if section["durable_every"]
        else "only as the run's safety net (no failure needs it in this model)"
    )
    lines = [
        "",
        f"two-level  (memory tier + durable tier; {100 * section['durable_share']:.1f}% of failures need the durable tier)",
        f"  memory save every  {short_duration(section['memory_interval'])}",
        f"  durable save       {durable}",
        f"  goodput            {100 * section['goodput']:.2f}%  vs {100 * section['single_level_goodput']:.2f}% with the"
        f" durable tier alone (every {short_duration(section['single_level_interval'])})",
        f"  lost work/failure  {short_duration(section['lost_work_per_failure'])}"
        f"  vs {short_duration(section['single_level_lost_work_per_failure'])}",
    ]
    if "simulated" in section:
        sim = section["simulated"]
        lines.append(
            f"  simulated goodput  {100 * sim['goodput_mean']:.2f}% ± {100 * sim['goodput_stderr']:.3f}"
        )
    lines.append(
        "  model: Vaidya (1994), Di et al. (2014), SCR: each level at its optimum for its share of failures."
    )
    return lines
