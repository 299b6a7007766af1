"""``goodput launch [options] -- script.py args``: run a training script under torchrun with restarts."""

from __future__ import annotations

import argparse
from typing import Any

from goodput._env import RUN_DIR
from goodput.cli._command import add_command
from goodput.cli._script import script_of
from goodput.errors import ConfigError

__all__ = ["register"]

_EPILOG = """examples:
  goodput launch --nproc 2 --max-restarts 10 --run-dir runs/exp1 -- train.py --lr 3e-4
  goodput launch --nproc 8 --nnodes 2 --node-rank 0 --rdzv-endpoint 10.0.0.1:29500 --run-dir runs/exp1 -- train.py
  goodput launch --nproc 2 --faults 'kill@step=30,rank=1' --run-dir runs/drill -- train.py

The run folder has one source: --run-dir (default: $GOODPUT_RUN_DIR) is exported as GOODPUT_RUN_DIR, and a
script whose Run() names another folder is stopped with one line. It is required: launching again with the same
folder resumes the run. A run already complete trains nothing and says so (exit 0).

Before anything starts, one line and exit 2 for: a script that does not exist (or -m MODULE whose package is
not found), no --run-dir, a run folder that cannot be created or written. The checkpoint root is the script's;
a remote one is checked (listed, a probe object written and removed) by rank 0 at the start of the first
attempt, and credentials the store refuses stop the job there with one line naming the URL and where
credentials are read from (exit 78).

Preemption: the first SIGTERM, SIGINT (Ctrl-C) or --preempt-signal makes every rank finish its step; the job
saves one durable checkpoint within --grace seconds, prints where, and exits 75; run the same command to
resume. A second signal stops everything at once. No process of the job outlives goodput launch.

Warm restarts (--restart warm; the script calls run.warm(train_fn)): a failed rank is replaced by a hot spare
while the survivors keep their processes. Preemption, the crash-loop count (each warm generation is an
attempt), the errors that stop at once and the exit codes below are the same; spares are ended with the job.
An elastic --nnodes MIN:MAX needs --shrink-after: a node lost whole shrinks the job onto the others in place,
and a node that comes later (the same command on another machine) is admitted through a new round of torch's
c10d rendezvous and grows the job at a step boundary.

Output: the terminal shows what the workers print (their tracebacks left out), one line per failure (what
failed, what was done) and a final line naming the cause of a failed job; the full logs (torchrun's and each
worker's stdout and stderr) are in <run-dir>/launches/<launch>/logs. --verbose shows all of it on the terminal.

exit status: the script's; 3 when consecutive attempts of this launch made no progress, or failed with the
same error in the same step (a crash loop; a new launch starts a new count); 75 after a preemption save, or on the surviving nodes of a multi-node job whose
rendezvous lost a node for --rdzv-timeout (a scheduler may requeue); 78 when a rank raised an
error a restart cannot fix (ConfigError, StateMismatch, AccessRefused: storage that refuses the credentials,
or committed checkpoints of which none loads: --allow-fresh-start trains from step 0 instead); 2 for a mistake
in the command line or a failed pre-flight check. A crash loop quotes the failing rank's last
error from torch's error files (<run-dir>/launches/<launch>/logs): the newest that is not a peer's reaction
(a collective failing because another rank died)."""


_HELP = "run a training script under torchrun, restarting it on failure"
_DESCRIPTION = (
    "A thin front over torchrun: restarts come from its elastic agent; multi-node through "
    "its c10d rendezvous. goodput adds the run folder, fault injection, crash-loop detection, errors "
    "that stop the job at once, and preemption with one agreed save."
)


def register(sub: Any) -> None:
    parser = add_command(sub, "launch", help=_HELP, description=_DESCRIPTION, epilog=_EPILOG)
    parser.add_argument("--nproc", type=int, default=1, help="worker processes per node (default 1)")
    parser.add_argument(
        "--nnodes",
        default="1",
        help="number of nodes, or MIN:MAX (elastic; with --restart warm it needs --shrink-after; default 1)",
    )
    parser.add_argument("--node-rank", type=int, default=None, help="this node's rank (static multi-node)")
    parser.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the c10d rendezvous (multi-node)")
    parser.add_argument("--rdzv-id", default="goodput", help="job id shared by every node")
    parser.add_argument(
        "--rdzv-timeout",
        default="300s",
        help="multi-node: how long a rendezvous waits for every node, and for the node that hosts it to answer; "
        "past it the surviving nodes stop with exit 75 so the scheduler can requeue the job (default 300s)",
    )
    parser.add_argument(
        "--max-restarts", type=int, default=3, help="restarts of the worker group (default 3)"
    )
    parser.add_argument(
        "--run-dir",
        default=RUN_DIR.get() or None,
        help="the run folder (checkpoints, ledger, launch history); required (default: $GOODPUT_RUN_DIR); "
        "the same folder again resumes the run",
    )
    parser.add_argument("--faults", default="", help="fault plan, e.g. 'kill@step=30,rank=1' (see docs)")
    parser.add_argument(
        "--crash-loop",
        type=int,
        default=3,
        help="attempts without progress (or with the same error in the same step) that stop the job (default 3)",
    )
    parser.add_argument(
        "--preempt-signal",
        default="USR1",
        help="early-warning signal that starts a preemption save, besides SIGTERM and SIGINT (default USR1, "
        "as in SLURM's --signal=USR1@90)",
    )
    parser.add_argument(
        "--grace",
        default="60s",
        help="time from the first signal to save before everything is ended (default 60s)",
    )
    parser.add_argument(
        "--restart",
        choices=("cold", "warm"),
        default="cold",
        help="cold: torchrun restarts the whole group (default); warm: survivors keep their process and a hot "
        "spare replaces the failed rank (the script calls run.warm(train_fn))",
    )
    parser.add_argument(
        "--spares", type=int, default=1, help="hot spare processes per node for --restart warm"
    )
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=30.0,
        help="--restart warm: seconds before a collective with a failed or hung peer fails (default 30; keep it "
        "below the script's hang timeout)",
    )
    parser.add_argument(
        "--reform-timeout",
        type=float,
        default=30.0,
        help="--restart warm: seconds a warm restart may take to re-form the group and recover before the job "
        "falls back to a cold restart (default 30; with a hang, keep --collective-timeout plus this below the "
        "script's hang timeout)",
    )
    parser.add_argument(
        "--shrink-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="--restart warm: when a rank fails and no spare is ready within SECONDS, the survivors train on as "
        "a smaller group (no restart, no checkpoint read) and grow back when a spare is ready (default: off, "
        "wait for a replacement); with --nnodes N a node lost whole (silent for --collective-timeout) is "
        "dropped at once; the script's loader needs global_batch_size= (docs/warm-restarts.md)",
    )
    parser.add_argument(
        "--min-world",
        type=int,
        default=1,
        help="--shrink-after: the fewest ranks the job trains on (default 1)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show torchrun's and every worker's output on the terminal, tracebacks included (by default: the "
        "workers' prints, one line per failure, and the full logs in <run-dir>/launches/<launch>/logs)",
    )
    parser.add_argument(
        "--allow-fresh-start",
        action="store_true",
        help="when committed checkpoints exist and none of them loads, train from step 0 beside them "
        "(without it the job stops: exit 78)",
    )
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- script.py and its arguments")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from goodput.launch.launcher import LaunchConfig, launch_job
    from goodput.units import parse_duration

    script = script_of(args)
    config = LaunchConfig(
        script=tuple(script),
        nproc=args.nproc,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        rdzv_timeout=parse_duration(args.rdzv_timeout, what="--rdzv-timeout"),
        max_restarts=args.max_restarts,
        run_dir=args.run_dir,
        faults=args.faults,
        crash_loop=args.crash_loop,
        preempt_signal=args.preempt_signal,
        grace=parse_duration(args.grace, what="--grace"),
        verbose=args.verbose,
        allow_fresh_start=args.allow_fresh_start,
    )
    if args.shrink_after is not None and args.restart != "warm":
        raise ConfigError("--shrink-after needs --restart warm (a cold restart always restarts every rank)")
    if args.restart == "warm":
        from goodput.warm.agent import WarmConfig, launch_warm

        warm = WarmConfig(
            spares=args.spares,
            pg_timeout=args.collective_timeout,
            reform_timeout=args.reform_timeout,
            shrink_after=args.shrink_after,
            min_world=args.min_world,
        )
        return launch_warm(config, warm)
    return launch_job(config)
