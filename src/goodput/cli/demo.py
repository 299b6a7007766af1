"""``goodput demo``: train a small LM through random SIGKILLs and show where the time went."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from goodput.cli._command import add_command

__all__ = ["register"]

_EPILOG = """examples:
  goodput demo                                  # ~3 minutes on 2 CPU cores
  goodput demo --mtbf 20s --steps 800           # harsher failures, longer run
  goodput demo --strategy torch_save            # compare with the blocking baseline
  goodput demo --restart cold                   # torchrun restarts every rank (the baseline)
  goodput demo --slow-rank 1                    # a straggler drill: rank 1 runs 1.5x slower
  goodput demo --spares 0                       # no spare: shrink in place, grow back (capacity goodput)
  goodput demo --data-url s3://bucket/corpus    # data on S3 (credentials from AWS_* variables)
  goodput report runs/demo-...                  # read a finished run again"""


_HELP = "the main job: train a small LM through random SIGKILLs, then report goodput"
_DESCRIPTION = (
    "Trains a byte-level transformer LM on Python's standard-library source with 2 ranks "
    "under torchrun, reading sharded data through the local cache, saving memory-tier checkpoints to "
    "/dev/shm and async durable checkpoints, each at the planner's interval, while random SIGKILLs hit the "
    "ranks; goodput's warm-restart agent (or, with --restart cold, torchrun) restarts them and goodput "
    "resumes exactly. Prints the goodput report and writes the timeline and loss plots."
)


def register(sub: Any) -> None:
    parser = add_command(sub, "demo", help=_HELP, description=_DESCRIPTION, epilog=_EPILOG)
    parser.add_argument("--run-dir", default=None, help="run folder (default: a new folder under ./runs/)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--steps", type=int, default=2000, help="training steps (default 2000)")
    parser.add_argument("--mtbf", default="40s", help="mean time between injected SIGKILLs (default 40s)")
    parser.add_argument("--no-faults", action="store_true", help="inject no failures")
    parser.add_argument("--strategy", default="dcp_async", help="torch_save, dcp or dcp_async (default)")
    parser.add_argument("--every", default="auto", help="checkpoint interval: steps, a duration, or auto")
    parser.add_argument("--data-url", default=None, help="where the shards live (default: in the run folder)")
    parser.add_argument("--max-restarts", type=int, default=30, help="torchrun's restart budget (default 30)")
    parser.add_argument("--seed", type=int, default=0, help="seed of training and of the fault schedule")
    parser.add_argument(
        "--slow-rank",
        type=int,
        default=None,
        metavar="RANK",
        help="a straggler drill: RANK's process runs 1.5x slower (slow@rank=RANK,factor=1.5,persist) and the "
        "straggler detector names it; the report gets a straggler section",
    )
    parser.add_argument(
        "--restart",
        choices=("cold", "warm"),
        default="warm",
        help="warm: survivors keep their process and a hot spare takes the failed rank (goodput launch "
        "--restart warm; default); cold: torchrun restarts every rank",
    )
    parser.add_argument(
        "--spares",
        type=int,
        default=2,
        help="--restart warm: hot spares (default 2); 0: no spare, the survivors shrink in place and the job "
        "grows back when a replacement is ready",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from goodput.cli._paths import check_run_folder
    from goodput.demo.main import DemoConfig, run_demo
    from goodput.units import parse_duration

    run_dir = args.run_dir or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S"))
    check_run_folder(run_dir, "--run-dir")
    config = DemoConfig(
        run_dir=run_dir,
        nproc=args.nproc,
        steps=args.steps,
        mtbf=parse_duration(args.mtbf, what="--mtbf"),
        strategy=args.strategy,
        every=args.every,
        data_url=args.data_url,
        max_restarts=args.max_restarts,
        seed=args.seed,
        faults=not args.no_faults,
        slow_rank=args.slow_rank,
        restart=args.restart,
        spares=args.spares,
    )
    return run_demo(config)
