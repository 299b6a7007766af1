"""The shrink-and-regrow section of ``goodput plan``: no spare, the survivors go on and a replacement joins later.

    goodput plan --failures-per-day 24 --ckpt-stall 20s --restart 5m \\
        --shrink 20s --grow 40s --regrow 10m --ranks 512 --step-time 2s
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from goodput.cli._plan_plot import short_duration
from goodput.errors import ConfigError
from goodput.planning.model import PlanInputs
from goodput.planning.shrink import goodput_shrink
from goodput.units import parse_duration

__all__ = ["add_arguments", "shrink_lines", "shrink_section"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "no spare: shrink in place and grow back (give --shrink to plan it beside restarts)"
    )
    group.add_argument(
        "--shrink", metavar="DUR", help="failure noticed to training again on the survivors (S)"
    )
    group.add_argument(
        "--grow",
        metavar="DUR",
        help="replacement ready to training again at full size (G; default: --shrink)",
    )
    group.add_argument(
        "--regrow",
        metavar="DUR",
        help="failure noticed to a replacement ready to join (T; default: --restart)",
    )
    group.add_argument("--ranks", type=int, metavar="N", help="ranks the job reserved (default: --gpus)")
    group.add_argument(
        "--step-time",
        default="0s",
        metavar="DUR",
        help="a training step: a failure loses half of one (default 0s)",
    )


def _duration(text: str, flag: str) -> float:
    if text.strip().startswith("-"):
        raise ConfigError(f"{flag} {text!r} must not be negative")
    return parse_duration(text, what=flag)


def shrink_section(args: argparse.Namespace, inputs: PlanInputs, interval: float) -> dict[str, Any] | None:
    """The shrink model at the recommended ``interval`` as a JSON-able dict (seconds), or None without
    ``--shrink``. Checkpoints go on at that interval (a failure a shrink cannot answer still needs one), so
    their stall share is the model's base."""
    if args.shrink is None:
        for flag, value in (("--grow", args.grow), ("--regrow", args.regrow), ("--ranks", args.ranks)):
            if value is not None:
                raise ConfigError(f"{flag} plans a shrink in place: give --shrink too")
        return None
    ranks = args.ranks if args.ranks is not None else inputs.gpus
    if ranks is None:
        raise ConfigError("--shrink needs the job's size: give --ranks N (or --gpus N)")
    shrink = _duration(args.shrink, "--shrink")
    costs = {
        "shrink": shrink,
        "grow": shrink if args.grow is None else _duration(args.grow, "--grow"),
        "regrow": inputs.restart if args.regrow is None else _duration(args.regrow, "--regrow"),
        "detect": inputs.detect,
        "lost": _duration(args.step_time, "--step-time") / 2.0,
    }
    base = interval / (interval + inputs.ckpt_stall) if interval > 0 and math.isfinite(interval) else 1.0
    answer = goodput_shrink(mtbf=inputs.mtbf, ranks=ranks, base=base, **costs)
    return {"ranks": ranks, "interval": interval, "base": base, **costs, **answer.to_dict()}


def shrink_lines(section: dict[str, Any], restart_goodput: float) -> list[str]:
    """The text ``goodput plan`` prints for the shrink section."""
    return [
        "",
        f"no spare: shrink in place and grow back  ({section['ranks']} ranks reserved)",
        f"  costs              shrink S={short_duration(section['shrink'])}  grow G={short_duration(section['grow'])}"
        f"  replacement ready T={short_duration(section['regrow'])}  lost/failure L={short_duration(section['lost'])}",
        f"  goodput            {100 * section['goodput']:.2f}%  vs {100 * restart_goodput:.2f}% restarting at the "
        "recommended interval",
        f"  capacity goodput   {100 * section['capacity_goodput']:.2f}%  (productive rank-seconds / reserved; "
        f"{section['short_share']:.3g} ranks missing on average)",
        "  model: goodput = base x (1 - (D+S+G+L)/M); capacity goodput = goodput x (1 - (T-S)/(M N)).",
    ]
