"""``goodput verify-resume``: the same training twice, once with SIGKILLs; exit 0 only when bitwise identical."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

__all__ = ["register"]

_EPILOG = """what it compares: the final model and optimizer state (sha256 of every tensor) and, for every rank
and step, the samples trained and the step's random draws (the batch after random augmentation in the data
workers, the loss's bits, which depend on dropout), between an uninterrupted run and one killed KILLS times at
random steps and inside checkpoint writes, async uploads and restores. Deterministic settings: torch deterministic
algorithms, one thread per rank (torchrun), seeded order and init; CPU/gloo or CUDA/NCCL.

exit status: 0 identical, 1 different (the first difference is printed), 2 bad arguments."""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "verify-resume",
        help="prove that a run interrupted by SIGKILLs ends bitwise identical to an uninterrupted one",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    parser.add_argument("--kills", type=int, default=4, help="SIGKILLs in the interrupted run (default 4)")
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps (default 5)")
    parser.add_argument("--strategy", default="dcp_async", help="torch_save, dcp or dcp_async")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule and of training")
    parser.add_argument("--work-dir", default=None, help="where both runs go (default: a temporary folder)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from goodput.demo.verify_train import fault_plan, prepare_data, train
    from goodput.errors import ConfigError
    from goodput.run.verify import first_difference, read_run

    if args.steps < 2 * args.every or args.kills < 0 or args.nproc < 1:
        raise ConfigError("need --steps >= 2 x --every, --kills >= 0 and --nproc >= 1")
    work = args.work_dir or tempfile.mkdtemp(prefix="goodput-verify-")
    os.makedirs(work, exist_ok=True)
    data = prepare_data(work)
    plan = fault_plan(args.kills, steps=args.steps, every=args.every, nproc=args.nproc, seed=args.seed)
    print(f"goodput verify-resume: {args.nproc} ranks, {args.steps} steps, {args.strategy}, in {work}")
    print(f"faults: {plan}")
    common = {
        "data": data,
        "nproc": args.nproc,
        "steps": args.steps,
        "every": args.every,
        "strategy": args.strategy,
        "seed": args.seed,
    }
    clean = train(os.path.join(work, "uninterrupted"), faults="", max_restarts=0, **common)
    killed = train(os.path.join(work, "interrupted"), faults=plan, max_restarts=args.kills + 2, **common)
    for name, status in (("uninterrupted", clean), ("interrupted", killed)):
        if status != 0:
            print(f"goodput verify-resume: the {name} run failed with exit status {status}", file=sys.stderr)
            return 1
    difference = first_difference(
        read_run(os.path.join(work, "uninterrupted")), read_run(os.path.join(work, "interrupted"))
    )
    if difference is not None:
        print(f"DIFFERENT: {difference}")
        return 1
    restarts = len(os.listdir(os.path.join(work, "interrupted", "attempts"))) - 1
    what = "final model, optimizer and every step's samples and random draws"
    print(f"IDENTICAL: {what} match after {restarts} restarts")
    return 0
