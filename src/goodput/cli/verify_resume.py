"""``goodput verify-resume [-- train.py args]``: a training run twice, once with SIGKILLs; exit 0 only when both
end bitwise identical. Without a script it checks the built-in demo training (the first paragraph below)."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any

from goodput.cli._command import add_command
from goodput.cli._script import add_ranks_and_steps, add_work_dir_and_script, script_of

__all__ = ["register"]

_EPILOG = """what it compares: the final model and optimizer state (sha256 of every tensor) and, for every rank
and step, the samples trained and the step's random draws (the batch after random augmentation in the data
workers, the loss's bits, which depend on dropout), between an uninterrupted run and one killed KILLS times at
random steps and inside checkpoint writes, async uploads and restores. Deterministic settings: torch deterministic
algorithms, one thread per rank (torchrun), seeded order and init; CPU/gloo or CUDA/NCCL.

with your script after '--': it runs twice under 'goodput launch' with GOODPUT_RECORDS=1, once uninterrupted
and once killed KILLS times at random steps and inside checkpoint writes, async uploads and restores (drawn
from where the first run saved). goodput.Run records every step's sample indices (from a ResumableLoader
iterated through run.batches), loss (given to run.step_done) and random generator states, and at run.close()
a digest of every piece of the final state: model and optimizer tensors, scheduler, scaler, step, extras, RNG
and data position. The first differing step and piece of final state are named, with the usual causes to
check. The script must be deterministic: seed random, numpy and torch at its start, use
torch.use_deterministic_algorithms(True) and a fixed thread count. --steps, --every and --strategy apply to
the built-in training only, as are --memory and --node-loss.
  goodput verify-resume --nproc 2 --kills 3 -- train.py --lr 1e-3

the built-in training keeps the memory tier on (like 'goodput demo'; --memory off for the durable tier alone)
and then also kills inside memory-tier writes and restores. --node-loss runs the interrupted job as two torchrun
agents on this machine (--nnodes 2, c10d rendezvous on 127.0.0.1, --nproc split between them) and loses node 1
at a random step: every process of it killed and its memory tier wiped, so its ranks restore from the replica
on node 0 ('peer'). The uninterrupted run is one agent of --nproc ranks (the split changes nothing it computes).
  goodput verify-resume --memory 2 --node-loss --kills 2
--restart warm runs both under the warm-restart agent (goodput launch --restart warm, one hot spare): the
survivors of a kill keep their process and recover live from a replica. A script that wants that hands its
training function to run.warm (docs/warm-restarts.md); one that does not still passes, restarted cold.

the workers' output (tracebacks of ranks that outlive a kill) goes to output.log in each run folder
(uninterrupted/ and interrupted/ under --work-dir), not to the terminal.
exit status: 0 identical, 1 different or a run failed (the first difference is printed), 2 bad arguments,
128 + N stopped by signal N (the run in progress stops as goodput launch stops; the temporary folder goes)."""


_HELP = "prove that a run interrupted by SIGKILLs ends bitwise identical to an uninterrupted one"


def register(sub: Any) -> None:
    parser = add_command(sub, "verify-resume", help=_HELP, description=__doc__, epilog=_EPILOG)
    add_ranks_and_steps(parser, training="built-in training", steps=60)
    parser.add_argument("--kills", type=int, default=4, help="SIGKILLs in the interrupted run (default 4)")
    parser.add_argument(
        "--every", type=int, default=None, help="built-in training: save every N steps (default 5)"
    )
    parser.add_argument("--strategy", default=None, help="built-in training: torch_save, dcp or dcp_async")
    parser.add_argument(
        "--memory",
        default=None,
        help="built-in training: memory-tier saves every N steps, auto, or off (default auto)",
    )
    parser.add_argument(
        "--node-loss",
        action="store_true",
        help="built-in training: two agents (--nnodes 2 on this machine); node 1 is lost at a random step",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule and of training")
    parser.add_argument(
        "--restart",
        choices=("cold", "warm"),
        default="cold",
        help="how the runs restart: cold (torchrun restarts the group; default) or warm (goodput launch "
        "--restart warm: survivors keep their process, a hot spare takes the dead rank)",
    )
    parser.add_argument(
        "--spares",
        type=int,
        default=None,
        help="--restart warm: hot spares (default 1; 0 with --shrink-after)",
    )
    parser.add_argument(
        "--shrink-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="your script, --restart warm --spares 0: the survivors of a kill shrink in place and grow back; "
        "compared with a reference on the same world sizes (see below)",
    )
    parser.add_argument(
        "--min-world",
        type=int,
        default=1,
        help="with --shrink-after: the fewest ranks to shrink to (default 1)",
    )
    add_work_dir_and_script(parser, runs="both runs")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from goodput.verify.session import in_work_folder

    script = script_of(args)
    _check_warm(args, script)

    def run(work: str) -> int:
        return _run_script(args, script, work) if script else _run_demo(args, work)

    return in_work_folder(run, args.work_dir, prefix="goodput-verify-", keep=args.keep, say=_stderr)


def _run_demo(args: argparse.Namespace, work: str) -> int:
    from goodput.demo.verify_train import fault_plan, prepare_data, train, train_two_nodes
    from goodput.errors import ConfigError
    from goodput.verify.demo import first_difference, read_run
    from goodput.verify.script import run_captured

    args.steps, args.every = args.steps or 60, args.every or 5
    args.strategy = args.strategy or "dcp_async"
    memory = _memory_every(args.memory)
    if args.steps < 2 * args.every or args.kills < 0 or args.nproc < 1:
        raise ConfigError("need --steps >= 2 x --every, --kills >= 0 and --nproc >= 1")
    if args.node_loss and (args.nproc < 2 or args.nproc % 2):
        raise ConfigError(f"--node-loss splits --nproc between two nodes: it must be even, got {args.nproc}")
    if args.node_loss and args.restart == "warm":
        raise ConfigError("--node-loss runs two torchrun agents (cold restarts): drop --restart warm")
    os.makedirs(work, exist_ok=True)
    data = prepare_data(work)
    plan = fault_plan(args.kills, steps=args.steps, every=args.every, nproc=args.nproc, seed=args.seed,
                      memory=memory != "off", node_loss=args.node_loss)  # fmt: skip
    nodes = ", 2 nodes" if args.node_loss else ""
    print(f"goodput verify-resume: {args.nproc} ranks{nodes}, {args.steps} steps, {args.strategy},"
          f" memory tier {memory}, {args.restart} restarts, in {work}")  # fmt: skip
    print(f"faults: {plan}")
    common = {
        "data": data,
        "nproc": args.nproc,
        "steps": args.steps,
        "every": args.every,
        "strategy": args.strategy,
        "seed": args.seed,
        "memory_every": memory,
        "restart": args.restart,
    }
    faulty = args.kills + 2 + int(args.node_loss)
    for name, faults, restarts in (("uninterrupted", "", 0), ("interrupted", plan, faulty)):
        run_dir = os.path.join(work, name)
        job = train_two_nodes if args.node_loss and faults else train
        launch = functools.partial(job, run_dir, faults=faults, max_restarts=restarts, **common)
        if not run_captured(launch, run_dir, name, _stderr, records=False):
            return 1
    difference = first_difference(
        read_run(os.path.join(work, "uninterrupted")), read_run(os.path.join(work, "interrupted"))
    )
    if difference is not None:
        print(f"DIFFERENT: {difference}")
        return 1
    what = "final model, optimizer and every step's samples and random draws"
    print(
        f"IDENTICAL: {what} match after {_restarts(os.path.join(work, 'interrupted'))}{_restored_from(work)}"
    )
    return 0


def _memory_every(value: str | None) -> str:
    """``--memory`` checked: ``auto`` (the default), ``off`` or a number of steps >= 1."""
    from goodput.errors import ConfigError

    value = "auto" if value is None else value.strip().lower()
    if value in ("auto", "off") or (value.isdigit() and int(value) >= 1):
        return value
    raise ConfigError(f"--memory takes a number of steps >= 1, auto or off, got {value!r}")


def _restored_from(work: str) -> str:
    """`` (restores from memory 2, peer 1)``: the tier each restore of the interrupted run came from."""
    from goodput.ledger import read_events

    tiers: dict[int, str] = {}
    for event in read_events(os.path.join(work, "interrupted"), rank=None):
        if event["event"] == "checkpoint_restored":
            tiers[int(event["attempt"])] = str(event.get("tier", "durable"))
    counts = {tier: list(tiers.values()).count(tier) for tier in sorted(set(tiers.values()))}
    return f" (restores from {', '.join(f'{t} {n}' for t, n in counts.items())})" if counts else ""


def _run_script(args: argparse.Namespace, script: list[str], work: str) -> int:
    from goodput.errors import ConfigError
    from goodput.verify.script import verify_resume

    demo_only = [
        f"--{name}" for name in ("steps", "every", "strategy", "memory") if getattr(args, name) is not None
    ]
    demo_only += ["--node-loss"] * args.node_loss
    if demo_only:
        raise ConfigError(
            f"{', '.join(demo_only)} appl{'y' if len(demo_only) > 1 else 'ies'} to the built-in training only;"
            " your script sets its own"
        )
    runs: dict[str, Any] = {"nproc": args.nproc, "kills": args.kills, "seed": args.seed, "work_dir": work}
    if args.shrink_after is not None:
        from goodput.verify.shrink import verify_shrink

        return verify_shrink(script, **runs, shrink_after=args.shrink_after, min_world=args.min_world)
    spares = 1 if args.spares is None else args.spares
    return verify_resume(script, **runs, restart=args.restart, spares=spares)


def _check_warm(args: argparse.Namespace, script: list[str]) -> None:
    """--spares, --shrink-after and --min-world: only where they mean something, in one line each."""
    from goodput.errors import ConfigError

    if (args.spares is not None or args.shrink_after is not None) and args.restart != "warm":
        raise ConfigError("--spares and --shrink-after apply to warm restarts: add --restart warm")
    if args.spares is not None and args.spares < 0:
        raise ConfigError(f"--spares must be >= 0, got {args.spares}")
    if args.shrink_after is None:
        if args.min_world != 1:
            raise ConfigError("--min-world applies with --shrink-after: add --shrink-after SECONDS")
        return
    if not script:
        raise ConfigError("--shrink-after verifies your script: give it after '--' (e.g. -- train.py)")
    if args.spares != 0:
        raise ConfigError(
            "--shrink-after verifies shrinking in place, with no spare to take a rank: add --spares 0"
        )
    if args.shrink_after < 0:
        raise ConfigError(f"--shrink-after must be >= 0 seconds, got {args.shrink_after}")


def _restarts(run_dir: str) -> str:
    """How the interrupted run restarted: "N restarts", or "N restarts (W warm, C cold)" under the warm agent."""
    import json

    from goodput.job.crashloop import attempt_records
    from goodput.warm.agent import AGENT_LOG

    log = os.path.join(run_dir, AGENT_LOG)
    if not os.path.exists(log):
        return f"{len(attempt_records(run_dir)) - 1} restarts"
    with open(log) as f:
        events = [json.loads(line)["event"] for line in f if line.strip()]
    warm, cold = events.count("warm_restart"), events.count("cold_restart")
    return f"{warm + cold} restarts ({warm} warm, {cold} cold)"


def _stderr(line: str) -> None:
    print(f"goodput verify-resume: {line}", file=sys.stderr)
