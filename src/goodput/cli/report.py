"""``goodput report RUN_DIR``: where a run's time went, measured against the planner, with advice.

goodput report runs/exp1
goodput report runs/exp1 --json
goodput report runs/exp1 --plot report.png --window 10m
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from goodput.cli._command import add_command
from goodput.cli._paths import check_output_file
from goodput.errors import ConfigError
from goodput.units import parse_duration

__all__ = ["register"]

_EPILOG = """\
categories add up to the wall time: productive, data_wait, checkpoint_stall, checkpoint_restore, init,
warmup, lost_work, restart_downtime, failure_detection, other. goodput = productive / wall time.
Every rank's ledger counts: the time axis is the lowest rank's (or --rank's), and failures, faults and
other events seen by any rank are added to it, each job event once.
"predicted" runs the planner (Daly's model) with the measured stall C, persist W, restart R, detection D
and observed MTBF, at the measured checkpoint interval.

examples:
  goodput report runs/exp1                       # the table and advice
  goodput report runs/exp1 --json                # one JSON object
  goodput report runs/exp1 --plot report.png     # timeline of attempts and goodput over time
  goodput report runs/exp1 --mtbf 6h             # assume an MTBF while no failure has been observed
"""


_HELP = "where a run's time went: goodput, badput by category, predicted vs measured, advice"
_DESCRIPTION = (
    "Account for every second of a run from its ledger (all attempts), compare with the planner, and advise."
)


def register(sub: Any) -> None:
    parser = add_command(sub, "report", help=_HELP, description=_DESCRIPTION, epilog=_EPILOG)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (holds ledger/)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--plot", metavar="FILE.png", help="write a timeline and goodput-over-time plot")
    parser.add_argument(
        "--rank",
        type=int,
        default=None,
        metavar="N",
        help="whose time axis to use (default: the lowest rank); every rank's failures and events count",
    )
    parser.add_argument("--mtbf", metavar="DUR", help="MTBF to assume while no failure is observed, e.g. 6h")
    parser.add_argument(
        "--window", metavar="DUR", help="rolling window of the goodput-over-time plot (default: wall/20)"
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from goodput.ledger.report import load_report

    if not os.path.isdir(args.run_dir):
        raise ConfigError(f"RUN_DIR {args.run_dir!r} is not a folder: pass the run folder that holds ledger/")
    mtbf = parse_duration(args.mtbf, what="--mtbf") if args.mtbf else None
    if mtbf is not None and mtbf <= 0:
        raise ConfigError(f"--mtbf must be positive, got {args.mtbf!r}")
    window = parse_duration(args.window, what="--window") if args.window else None
    if window is not None and window <= 0:
        raise ConfigError(f"--window must be positive, got {args.window!r}")
    if args.plot:
        check_output_file(args.plot, "--plot")
    try:
        report = load_report(args.run_dir, rank=args.rank, mtbf=mtbf)
    except ValueError as err:  # ConfigError is one; a ledger without any attempt_start is another
        raise ConfigError(f"cannot report on {args.run_dir!r}: {err}") from None
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.render())
    if args.plot:
        from goodput.ledger.plot import plot_report

        plot_report(report, args.plot, window=window)
        if not args.json:
            print(f"\nplot written to {args.plot}")
    return 0
