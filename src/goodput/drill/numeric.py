"""The numeric and straggler scenarios: faults that kill nothing (``nan``, ``spike``, ``bitflip``: the numeric
guard's, docs/numeric-faults.md) and a rank that keeps running slower (``slow``: docs/stragglers.md).

A numeric fault is refused by a run whose guard is off (exit 78, "the numeric guard is off"): the scenario then
reports that it did not apply, which meets its outcome, rather than failing a script that chose not to guard.
So does ``bitflip`` on a model without replicas (FSDP2 shards): the run refuses it at ``run.restore``, since only
the replica check could find it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from goodput.drill.runs import OUTPUT_LOG, LaunchSpec, result, run_launch
from goodput.drill.scenario import DrillContext, Scenario, ScenarioResult, register
from goodput.launch.launcher import EXIT_FATAL
from goodput.run._numeric_ops import NO_REPLICAS

__all__ = ["BITFLIP", "NAN", "SLOW", "SPIKE"]

_GUARD_OFF = "the numeric guard is off"


def _after_save(context: DrillContext, fraction: float) -> int:
    """A step at ``fraction`` of the run and past its first save (a rollback then has a checkpoint to go to)."""
    ref = context.reference
    first = min(ref.saves, default=0)
    return max(first + 1, min(int(ref.steps * fraction), ref.steps - 1))


def _numeric(plan: Callable[[DrillContext], str]) -> Callable[[DrillContext], ScenarioResult]:
    def run(context: DrillContext) -> ScenarioResult:
        faults = plan(context)
        run_dir = os.path.join(context.work_dir, "run")
        context.say(f"{faults}")
        done = run_launch(context, run_dir, LaunchSpec(faults=faults, restarts=1))
        said = _output(run_dir) if done.status == EXIT_FATAL else ""
        if _GUARD_OFF in said or NO_REPLICAS in said:
            reason = (
                "the script's numeric guard is off (Run(numeric=True) turns it on)"
                if _GUARD_OFF in said
                else "the model has no replicas to compare (FSDP2 shards): a flipped bit is found only by comparison"
            )
            return ScenarioResult(
                injected=faults, outcome="not run", met=True, exactly_once=None, identical=None,
                not_expected=reason,
            )  # fmt: skip
        rollbacks = _rollbacks(run_dir)
        problems = [] if rollbacks else ["no rollback in the ledger: the fault was not caught"]
        return result(
            context, run_dir, injected=f"{faults} ({rollbacks} rollback{'s' if rollbacks != 1 else ''})",
            status=done.status, seconds=done.seconds, problems=problems,
        )  # fmt: skip

    return run


def _output(run_dir: str) -> str:
    with open(os.path.join(run_dir, OUTPUT_LOG), errors="replace") as f:
        return f.read()


def _rollbacks(run_dir: str) -> int:
    from goodput.ledger import read_events

    return sum(1 for e in read_events(run_dir, rank=0) if e["event"] == "rollback")


def _last_rank(context: DrillContext) -> int:
    return context.nproc * context.nnodes - 1


NAN = register(
    Scenario(
        name="nan",
        injects="one rank's loss is NaN at one step",
        outcome="found by every rank one step later, rolled back in place; completed; every sample once; final "
        "state identical",
        run=_numeric(lambda c: f"nan@step={_after_save(c, 0.5)},rank={_last_rank(c)}"),
    )
)

SPIKE = register(
    Scenario(
        name="spike",
        injects="every rank's loss multiplied by 50 at one step (after the spike rule's warm-up)",
        outcome="found one step later, rolled back in place; completed; every sample once; final state identical",
        run=_numeric(lambda c: f"spike@step={_after_save(c, 0.75)},factor=50"),
    )
)

BITFLIP = register(
    Scenario(
        name="bitflip",
        injects="one bit of one parameter element of one rank flipped after its optimizer step (silent data "
        "corruption)",
        outcome="found at the next replica check, rolled back to before it; completed; every sample once; final "
        "state identical",
        run=_numeric(lambda c: f"bitflip@step={_after_save(c, 0.4)},rank={_last_rank(c)},bit=20"),
    )
)


def _slow(context: DrillContext) -> ScenarioResult:
    faults = f"slow@rank={_last_rank(context)},factor=2,persist"
    run_dir = os.path.join(context.work_dir, "run")
    context.say(faults)
    done = run_launch(context, run_dir, LaunchSpec(faults=faults, restarts=0))
    return result(
        context, run_dir, injected=f"{faults} (each step of the last rank twice as long)", status=done.status,
        seconds=done.seconds,
    )  # fmt: skip


SLOW = register(
    Scenario(
        name="slow",
        injects="one rank's steps take twice as long from its first step (a straggler)",
        outcome="completed, slower; every sample once; final state identical (the straggler detector, when on, "
        "names the rank and charges the wait as straggler_wait)",
        run=_slow,
    )
)
