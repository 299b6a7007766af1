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
from typing import Any

from goodput.drill.runs import OUTPUT_LOG, LaunchSpec, result, run_launch
from goodput.drill.scenario import DrillContext, Scenario, ScenarioResult, register
from goodput.job.codes import EXIT_FATAL
from goodput.run.numeric import NO_REPLICAS
from goodput.verify.rollback import hidden_spike, rise_before

__all__ = ["BITFLIP", "NAN", "SLOW", "SPIKE"]

_GUARD_OFF = "the numeric guard is off"


_SPIKE = 50  # the spike scenario's factor: injected where the rule catches a rise of half of it


def _after_save(context: DrillContext, fraction: float, *, after: int = 0) -> int:
    """A step at ``fraction`` of the run, past its first save (a rollback then has a checkpoint to go to) and
    past step ``after``."""
    ref = context.reference
    first = max(min(ref.saves, default=0), after)
    return max(first + 1, min(int(ref.steps * fraction), ref.steps - 1))


def _reference_events(context: DrillContext, name: str) -> list[dict[str, Any]]:
    return _events(context.reference.run_dir, name) if context.reference.run_dir else []


def _spike_plan(context: DrillContext) -> tuple[str, str]:
    """(the spike fault, or "" and why none is injected): at 75% of the run, after the rule's warm-up, when the
    uninterrupted run's own figure says the rule catches a rise of half the scenario's factor there."""
    configs = _reference_events(context, "numeric_config")
    warmup = int(configs[0]["spike_warmup"]) if configs else 0
    step = _after_save(context, 0.75, after=warmup)
    found = rise_before(_reference_events(context, "spike_rule"), step)
    if found is not None and 2 * found[1] > _SPIKE:
        return "", (
            f"not detectable on this loss: needs a rise of {found[1]:.1f}x (the spike rule's own figure at "
            f"step {found[0]} of the uninterrupted run; a {_SPIKE}x spike would pass unseen)"
        )
    return f"spike@step={step},factor={_SPIKE}", ""


def _bitflip_plan(context: DrillContext) -> tuple[str, str]:
    """(the bitflip fault, or "" and why none is injected): between two replica checks of the uninterrupted
    run's ``check_every``, the first of them at or after a save (a corrupted replica rolls back to the last check
    that agreed: a checkpoint must be there)."""
    ref = context.reference
    configs = _reference_events(context, "numeric_config")
    if not configs:  # the script's guard is off: the run refuses the fault, which the scenario reports
        return f"bitflip@step={_after_save(context, 0.4)},rank={_last_rank(context)},bit=20", ""
    every = configs[0].get("check_every")
    if every is None:
        return (
            "",
            "the replica check is off (NumericConfig(check_every=None)): a flipped bit is found only by it",
        )
    every = int(every)
    first = min(ref.saves, default=ref.steps + 1)
    agreed = -(-first // every) * every  # the first check with a checkpoint at or before it
    if agreed + every > ref.steps:
        return "", (
            f"no replica check can find it in {ref.steps} steps: checks come every {every} steps and the first "
            f"with a checkpoint before it is at step {agreed}, so the next is past the end (train longer or "
            "check more often: NumericConfig(check_every=...))"
        )
    return f"bitflip@step={agreed + max(1, every // 2)},rank={_last_rank(context)},bit=20", ""


def _numeric(plan: Callable[[DrillContext], tuple[str, str]]) -> Callable[[DrillContext], ScenarioResult]:
    def run(context: DrillContext) -> ScenarioResult:
        faults, why_not = plan(context)
        if not faults:
            context.say(why_not)
            outcome = "not detectable" if why_not.startswith("not detectable") else "not run"
            return ScenarioResult(
                injected="-",
                outcome=outcome,
                met=True,
                exactly_once=None,
                identical=None,
                not_expected=why_not,
            )
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
        rollbacks = len(_events(run_dir, "rollback"))
        hidden = _hidden_spike(_events(run_dir, "spike_missed"), rollbacks)
        if hidden:
            context.say(hidden)
            return ScenarioResult(
                injected=faults, outcome="not detectable", met=True, exactly_once=None, identical=None,
                not_expected=hidden,
            )  # fmt: skip
        return result(
            context, run_dir, injected=f"{faults} ({rollbacks} rollback{'s' if rollbacks != 1 else ''})",
            status=done.status, seconds=done.seconds, problems=_problems(run_dir, rollbacks),
        )  # fmt: skip

    return run


def _hidden_spike(missed: list[dict[str, Any]], rollbacks: int) -> str:
    """Why the run's spike was not detectable after all ("" where it was, where the guard missed one it could
    see, or where the run rolled back anyway): :func:`goodput.verify.rollback.hidden_spike`."""
    return "" if rollbacks else hidden_spike(missed)


def _problems(run_dir: str, rollbacks: int) -> list[str]:
    """What went wrong, in the run's own words: its stop line, a spike it did not catch and why."""
    said = [f"the run stopped: {e['line']}" for e in _events(run_dir, "numeric_stop")]
    said += [
        f"the spike at step {e['step']} was not caught: {e['why']}" for e in _events(run_dir, "spike_missed")
    ]
    if not rollbacks:
        return said or ["no rollback in the ledger: the fault was not caught"]
    return said


def _output(run_dir: str) -> str:
    with open(os.path.join(run_dir, OUTPUT_LOG), errors="replace") as f:
        return f.read()


def _events(run_dir: str, name: str) -> list[dict[str, Any]]:
    from goodput.ledger import read_events

    return [e for e in read_events(run_dir, rank=0) if e["event"] == name]


def _last_rank(context: DrillContext) -> int:
    return context.nproc * context.nnodes - 1


NAN = register(
    Scenario(
        name="nan",
        injects="one rank's loss is NaN at one step",
        outcome="found by every rank one step later, rolled back in place; completed; every sample once; final "
        "state identical",
        run=_numeric(lambda c: (f"nan@step={_after_save(c, 0.5)},rank={_last_rank(c)}", "")),
    )
)

SPIKE = register(
    Scenario(
        name="spike",
        injects="every rank's loss multiplied by 50 at one step (after the spike rule's warm-up)",
        outcome="found one step later, rolled back in place; completed; every sample once; final state identical",
        run=_numeric(_spike_plan),
    )
)

BITFLIP = register(
    Scenario(
        name="bitflip",
        injects="one bit of one parameter element of one rank flipped after its optimizer step (silent data "
        "corruption)",
        outcome="found at the next replica check, rolled back to before it; completed; every sample once; final "
        "state identical",
        run=_numeric(_bitflip_plan),
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
