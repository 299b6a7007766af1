"""``goodput plan``: how often to checkpoint a job, and what goodput to expect.

    goodput plan --gpus 1024 --days 30 --afr 0.01 --interval 15m 30m 1h 2h \\
        --ckpt-stall 20s --persist 90s --restart 10m --detect 2m --plot plan.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from goodput.cli._command import add_command
from goodput.cli._paths import check_output_file
from goodput.cli._plan_plot import short_duration
from goodput.cli._plan_scale import add_arguments as add_scale_arguments
from goodput.cli._plan_scale import run_scale
from goodput.cli._plan_shrink import add_arguments as add_shrink_arguments
from goodput.cli._plan_shrink import shrink_lines, shrink_section
from goodput.cli._plan_twolevel import add_arguments as add_two_level_arguments
from goodput.cli._plan_twolevel import two_level_lines, two_level_section
from goodput.errors import ConfigError
from goodput.planning import model
from goodput.planning.model import DAY, PlanInputs
from goodput.units import parse_duration

__all__ = ["register"]

HOUR = 3600.0
_DEFAULT_INTERVALS = ("30m", "1h", "2h", "4h")

_EPILOG = """\
durations take a unit: ms, s, m, h, d (e.g. 90s, 30m, 2h); a bare number is an error, except for --days
(30 means 30 days; 36h works too).

examples:
  # 1024 GPUs for 30 days, each failing 1% a year; async checkpoints that stall 20 s and persist in 90 s
  goodput plan --gpus 1024 --days 30 --afr 0.01 --interval 15m 30m 1h 2h \\
      --ckpt-stall 20s --persist 90s --restart 10m --detect 2m --plot plan.png

  # an observed 8.6 interruptions a day, free checkpoints and restarts: 2 h intervals give 64% goodput to
  # first order (1 - 8.6 h/24 h) and 68% under Daly's exact model (--days only adds the failure probability)
  goodput plan --failures-per-day 8.6 --interval 2h

  # the same rate, observed on 16384 GPUs, scaled to a 512-GPU job (failures grow with the device count)
  goodput plan --failures-per-day 8.6 --observed-gpus 16384 --gpus 512 --ckpt-stall 30s --restart 10m

  # no spare: 512 ranks shrink in place at each failure (20 s) and grow back when a replacement is ready
  goodput plan --failures-per-day 24 --ckpt-stall 20s --restart 5m --shrink 20s --grow 40s --regrow 10m \
      --ranks 512 --step-time 2s

  # machine-readable, with a Monte Carlo check of every row (1000 simulated jobs)
  goodput plan --gpus 512 --afr 0.02 --days 14 --ckpt-stall 1m --restart 15m --json --simulate 1000

model: the interval is compute time between checkpoints. Goodput is Daly's (2006) exact expected-time model
with detection + restart + persist charged on every failure; "1st order" is 1 - C/t - (R + D + t/2 + W)/M.
The recommended interval minimises Daly's model and is never shorter than --persist. Where the first-order
formula falls below zero (checkpoints more often than they take), the table shows "n/a (saves queue)".
"""


_HELP = "how often to checkpoint, and the goodput each interval buys"
_DESCRIPTION = (
    "Plan checkpointing for a job: its failure probability and MTBF, the time each checkpoint\n"
    "interval wastes, the goodput it buys, and the best interval (Young, Daly, and the exact optimum)."
)


def register(sub: Any) -> None:
    parser = add_command(sub, "plan", help=_HELP, description=_DESCRIPTION, epilog=_EPILOG)
    job = parser.add_argument_group("the job and its failures (give --gpus and --afr, or --failures-per-day)")
    job.add_argument("--gpus", type=int, metavar="N", help="devices the job runs on")
    job.add_argument(
        "--afr", type=float, metavar="RATE", help="annualized failure rate per device, e.g. 0.01"
    )
    job.add_argument("--failures-per-day", type=float, metavar="RATE", help="observed interruptions per day")
    job.add_argument(
        "--observed-gpus",
        type=int,
        metavar="N",
        help="devices of the job whose --failures-per-day was observed: the rate is scaled to --gpus",
    )
    job.add_argument(
        "--days",
        metavar="DUR",
        help="length of the job: days (30) or a duration (30d, 36h); only for the failure probability "
        "and --simulate",
    )
    costs = parser.add_argument_group("checkpoint and recovery costs (durations with units)")
    costs.add_argument(
        "--interval", nargs="+", metavar="DUR", help="intervals to compare (default: 30m 1h 2h 4h)"
    )
    costs.add_argument(
        "--ckpt-stall", default="0s", metavar="DUR", help="training blocked per checkpoint (C)"
    )
    costs.add_argument("--persist", default="0s", metavar="DUR", help="stall end to durable checkpoint (W)")
    costs.add_argument("--restart", default="0s", metavar="DUR", help="failure noticed to training again (R)")
    costs.add_argument("--detect", default="0s", metavar="DUR", help="failure to failure noticed (D)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    out.add_argument("--plot", metavar="FILE.png", help="draw goodput against the interval into a PNG")
    out.add_argument(
        "--simulate", type=int, metavar="RUNS", help="add a Monte Carlo check of RUNS jobs per row"
    )
    out.add_argument("--seed", type=int, default=0, help="seed of the Monte Carlo runs (default 0)")
    add_two_level_arguments(parser)
    add_shrink_arguments(parser)
    add_scale_arguments(parser)
    parser.set_defaults(handler=run)


def _inputs(args: argparse.Namespace) -> PlanInputs:
    if args.failures_per_day is None and args.gpus is None and args.afr is None:
        raise ConfigError("say how often the job fails: --gpus N --afr RATE, or --failures-per-day RATE")
    if args.failures_per_day is not None and args.afr is not None:
        raise ConfigError("--failures-per-day conflicts with --afr: give one or the other")
    if args.observed_gpus is not None and (args.failures_per_day is None or args.gpus is None):
        raise ConfigError(
            "--observed-gpus scales an observed rate to another job size: give --failures-per-day and --gpus"
        )
    if args.failures_per_day is not None and args.gpus is not None and args.observed_gpus is None:
        raise ConfigError(
            "--failures-per-day conflicts with --gpus: give one or the other, or add --observed-gpus N "
            "to scale the rate observed on N devices to --gpus"
        )
    if args.failures_per_day is None and args.afr is None:
        raise ConfigError("--gpus needs --afr (the annualized failure rate per device, e.g. 0.01)")
    if args.failures_per_day is None and args.gpus is None:
        raise ConfigError("--afr needs --gpus (how many devices the job runs on)")
    return PlanInputs(
        days=_days(args.days),
        gpus=args.gpus,
        afr=args.afr,
        failures_per_day=args.failures_per_day,
        observed_gpus=args.observed_gpus,
        ckpt_stall=_cost(args.ckpt_stall, "--ckpt-stall"),
        persist=_cost(args.persist, "--persist"),
        restart=_cost(args.restart, "--restart"),
        detect=_cost(args.detect, "--detect"),
    )


def _cost(text: str, flag: str) -> float:
    if text.strip().startswith("-"):
        raise ConfigError(f"{flag} {text!r} must not be negative")
    return parse_duration(text, what=flag)


def _days(text: str | None) -> float | None:
    """--days: a bare number of days, or a duration with its unit."""
    if text is None:
        return None
    if text.strip().startswith("-"):
        raise ConfigError(f"--days {text!r} must not be negative")
    try:
        value = float(text)
    except ValueError:
        value = parse_duration(text, what="--days") / DAY
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"--days {text!r} must be longer than zero")
    return value


def _intervals(texts: list[str] | None) -> list[float]:
    values = [_cost(text, "--interval") for text in texts or _DEFAULT_INTERVALS]
    for text, value in zip(texts or _DEFAULT_INTERVALS, values, strict=True):
        if value <= 0:
            raise ConfigError(f"--interval {text!r} must be longer than zero")
    return sorted(set(values))


def _row(inputs: PlanInputs, interval: float) -> dict[str, Any]:
    costs = inputs.costs()
    waste = model.waste_per_failure(
        interval, restart=inputs.restart, persist=inputs.persist, detect=inputs.detect
    )
    return {
        "interval_hours": interval / HOUR,
        "lost_work_per_failure_hours": model.lost_work_per_failure(interval, persist=inputs.persist) / HOUR,
        "expected_waste_per_failure_hours": waste / HOUR,
        "daily_waste_hours": model.daily_waste(interval, costs) / HOUR,
        "goodput": model.goodput_daly(interval, costs),
        "goodput_first_order": model.goodput_first_order(interval, costs),
    }


def _simulated(inputs: PlanInputs, interval: float, runs: int, seed: int) -> dict[str, float]:
    from goodput.planning.simulation import simulate_goodput

    assert inputs.days is not None  # run() asks for --days with --simulate
    intervals = max(1, round(inputs.days * DAY / interval))
    result = simulate_goodput(inputs.costs(), intervals=intervals, interval=interval, runs=runs, seed=seed)
    return result.to_dict()


def build_plan(
    inputs: PlanInputs, intervals: list[float], *, simulate: int | None = None, seed: int = 0
) -> dict[str, Any]:
    """The whole plan as one JSON-able dict (hours and fractions)."""
    mtbf, costs = inputs.mtbf, inputs.costs()
    exact = model.optimal_interval(costs)
    rows = [_row(inputs, interval) for interval in intervals]
    if simulate is not None:
        for row, interval in zip(rows, intervals, strict=True):
            row["simulated"] = _simulated(inputs, interval, simulate, seed)
    return {
        "inputs": {
            "days": inputs.days,
            "gpus": inputs.gpus,
            "afr": inputs.afr,
            "failures_per_day": DAY / mtbf,
            "observed_failures_per_day": inputs.failures_per_day,
            "observed_gpus": inputs.observed_gpus,
            "ckpt_stall_seconds": inputs.ckpt_stall,
            "persist_seconds": inputs.persist,
            "restart_seconds": inputs.restart,
            "detect_seconds": inputs.detect,
        },
        "failure_probability": inputs.failure_probability,
        "expected_failures": None if inputs.days is None else inputs.days * DAY / mtbf,
        "mtbf_hours": mtbf / HOUR,
        "rows": rows,
        "optimal_interval_hours": {
            "young": model.young_interval(inputs.ckpt_stall, mtbf) / HOUR,
            "daly": model.daly_interval(inputs.ckpt_stall, mtbf) / HOUR,
            "exact": exact / HOUR,
        },
        "recommended": {
            "interval_hours": exact / HOUR,
            # With no stall and no persist time the optimum is 0; goodput tends to exp(-(R + D)/M) there.
            "goodput": model.goodput_daly(exact, costs)
            if exact > 0
            else math.exp(-(inputs.restart + inputs.detect) / mtbf),
        },
    }


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def _first_order(value: float) -> str:
    """The first-order goodput; below zero the formula no longer describes a job (saves would queue)."""
    return _pct(value) if value >= 0 else "n/a (saves queue)"


def _job_line(plan: dict[str, Any], inputs: PlanInputs) -> str:
    length = "" if inputs.days is None else f" x {inputs.days:g} days"
    if inputs.observed_gpus is not None:
        return (
            f"{inputs.failures_per_day:g} failures/day observed on {inputs.observed_gpus} GPUs, scaled to "
            f"{inputs.gpus} GPUs: {plan['inputs']['failures_per_day']:.3g} failures/day{length}"
        )
    if inputs.gpus is not None:
        return f"{inputs.gpus} GPUs{length}, AFR {100 * (inputs.afr or 0):g}% per GPU-year"
    return f"{plan['inputs']['failures_per_day']:g} failures/day{length}"


def _probability_line(plan: dict[str, Any]) -> str:
    if plan["failure_probability"] is None:
        return "failure probability  (give --days for the chance of at least one failure)"
    return (
        f"failure probability  {_pct(plan['failure_probability'])}  "
        f"({plan['expected_failures']:.2f} failures expected)"
    )


def _row_line(row: dict[str, Any]) -> str:
    line = (
        f"{short_duration(row['interval_hours'] * HOUR):>9}  "
        f"{short_duration(row['expected_waste_per_failure_hours'] * HOUR):>13}  "
        f"{short_duration(row['daily_waste_hours'] * HOUR):>11}  "
        f"{_first_order(row['goodput_first_order']):>9}  {_pct(row['goodput']):>8}"
    )
    if "simulated" in row:
        sim = row["simulated"]
        line += f"  {_pct(sim['goodput_mean']):>8} ± {100 * sim['goodput_stderr']:.3f}"
    return line


def _table(plan: dict[str, Any], inputs: PlanInputs) -> str:
    """The plan as the readable text ``goodput plan`` prints."""
    stall, persist = short_duration(inputs.ckpt_stall), short_duration(inputs.persist)
    restart, detect = short_duration(inputs.restart), short_duration(inputs.detect)
    mtbf_h = plan["mtbf_hours"]
    lines = [
        f"job                  {_job_line(plan, inputs)}",
        _probability_line(plan),
        f"MTBF                 {mtbf_h:.1f} h ({mtbf_h / 24:.1f} days)",
        f"costs                stall C={stall}  persist W={persist}  restart R={restart}  detect D={detect}",
        "",
        f"{'':38}  {'----- goodput -----':>19}",
        f"{'interval':>9}  {'waste/failure':>13}  {'daily waste':>11}  {'1st order':>9}  {'exact':>8}",
    ]
    if any("simulated" in row for row in plan["rows"]):
        lines[-2] += "  simulated"
        lines[-1] += "  mean ± s.e. (%)"
    lines += [_row_line(row) for row in plan["rows"]]
    opt, rec = plan["optimal_interval_hours"], plan["recommended"]
    lines.append("")
    if rec["interval_hours"] == 0:
        lines.append(
            "recommended interval as short as you can: with no checkpoint stall, shorter always wins"
        )
    else:
        lines.append(
            f"recommended interval {short_duration(rec['interval_hours'] * HOUR)} -> goodput {_pct(rec['goodput'])}"
            f"  (Young {short_duration(opt['young'] * HOUR)}, Daly {short_duration(opt['daly'] * HOUR)},"
            f" exact {short_duration(opt['exact'] * HOUR)})"
        )
    lines += [
        "waste/failure: lost work (interval/2 + W) + R + D.  daily waste, 1st order: 1 - C/t - (R+D+t/2+W)/M.",
        "exact: Daly (2006) expected-time model (see 'goodput plan --help').",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.cluster_gpus is not None:
        if args.plot:
            check_output_file(args.plot, "--plot")
        return run_scale(args)
    inputs = _inputs(args)
    intervals = _intervals(args.interval)
    if args.simulate is not None and args.simulate < 2:
        raise ConfigError(f"--simulate needs at least 2 runs, got {args.simulate}")
    if args.simulate is not None and inputs.days is None:
        raise ConfigError("--simulate needs --days: the simulated jobs run for the job's length")
    if args.plot:
        check_output_file(args.plot, "--plot")
    plan = build_plan(inputs, intervals, simulate=args.simulate, seed=args.seed)
    two_level = two_level_section(args, inputs, simulate=args.simulate, seed=args.seed)
    if two_level is not None:
        plan["two_level"] = two_level
    shrink = shrink_section(args, inputs, plan["recommended"]["interval_hours"] * HOUR)
    if shrink is not None:
        plan["shrink"] = shrink
    if args.plot:
        from goodput.cli._plan_plot import plot_plan

        plot_plan(plan, inputs, intervals, args.plot)
    if args.json:
        json.dump(plan, sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        print(_table(plan, inputs))
        if two_level is not None:
            print("\n".join(two_level_lines(two_level)))
        if shrink is not None:
            print("\n".join(shrink_lines(shrink, plan["recommended"]["goodput"])))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0
