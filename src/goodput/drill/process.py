"""Process scenarios run inside one launch: ``rank`` (SIGKILLs of ranks), ``hang`` (a rank that stops making
progress) and ``preempt`` (SIGTERM and the scheduler's early-warning signal).

Each runs the script under ``goodput launch`` with a fault plan (:mod:`goodput.faults`) and compares its records
with the uninterrupted run; the kill plan is verify-resume's (:func:`goodput.verify.script.kill_plan`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import time

from goodput.drill.runs import (
    OUTPUT_LOG,
    LaunchSpec,
    finish,
    outcome_text,
    processes_of,
    result,
    run_launch,
    start_launch,
)
from goodput.drill.scenario import DrillContext, Scenario, ScenarioResult, register
from goodput.job.codes import EXIT_PREEMPTED
from goodput.run.watchdog import PHASE_FACTOR
from goodput.verify.records import read_records
from goodput.verify.script import kill_plan

__all__ = [
    "HANG",
    "PREEMPT",
    "RANK",
    "durable_before",
    "last_attempt",
    "launch_until_step",
    "recorded",
    "restored_steps",
    "said",
    "signal_step",
]

_WINDOW = 5  # seconds every rank pauses at the step a signal is sent at (a slow fault): the signal's window


def _rank(context: DrillContext) -> ScenarioResult:
    ref = context.reference
    kills = 6 if ref.async_saves else 4  # at steps, and inside a save, an upload (async saves) and a restore
    plan = kill_plan(
        kills, steps=ref.steps, saves=list(ref.saves), nproc=context.nproc * context.nnodes,
        seed=context.seed, async_saves=ref.async_saves,
    )  # fmt: skip
    run_dir = os.path.join(context.work_dir, "run")
    context.say(f"rank: {kills} SIGKILLs: {plan}")
    done = run_launch(context, run_dir, LaunchSpec(faults=plan, restarts=kills + 2))
    fired = (
        len(os.listdir(os.path.join(run_dir, "faults")))
        if os.path.isdir(os.path.join(run_dir, "faults"))
        else 0
    )
    problems = [] if fired else ["no kill fired (the plan's steps and phases never came)"]
    return result(
        context, run_dir, injected=f"{fired} SIGKILLs ({plan})", status=done.status, seconds=done.seconds,
        problems=problems,
    )  # fmt: skip


RANK = register(
    Scenario(
        name="rank",
        injects="SIGKILL of one rank at a step, inside a checkpoint write, an async upload and a restore",
        outcome="completed after restarts; every sample once; final state identical",
        run=_rank,
        runs=2,
    )
)


def _hang(context: DrillContext) -> ScenarioResult:
    ref = context.reference
    last = max(ref.steps - 1, 1)
    in_step = min(max(ref.saves[0] + 1, 1), last) if ref.saves else max(ref.steps // 3, 1)
    later = [s for s in ref.saves if s > in_step and s < ref.steps]
    plan = f"hang@step={in_step},rank={context.nproc * context.nnodes - 1}"
    if later:  # a rank that stops inside a save while its peers wait for it in the collectives
        plan += f"; hang@phase=checkpoint_write,step={later[0]},rank=0"
    run_dir = os.path.join(context.work_dir, "run")
    context.say(f"hang: {plan} (the script's hang timeout decides how long this takes)")
    done = run_launch(context, run_dir, LaunchSpec(faults=plan, restarts=4))
    detections = _hang_detections(run_dir)
    hangs = plan.count("hang@")
    problems = [] if len(detections) >= hangs else [f"{len(detections)} of {hangs} hangs detected"]
    seen = ", ".join(f"{reason} after {seconds:.0f}s" for reason, seconds in detections) or "none"
    return result(
        context, run_dir, injected=f"{plan} (detected: {seen})", status=done.status, seconds=done.seconds,
        problems=problems,
    )  # fmt: skip


def _hang_detections(run_dir: str) -> list[tuple[str, float]]:
    """Each hang the ranks declared: (reason, seconds without progress before it was declared)."""
    from goodput.ledger import read_events

    found: dict[int, tuple[str, float]] = {}
    for event in read_events(run_dir, rank=None):
        if event["event"] == "failure_detected" and str(event.get("reason", "")).startswith("hang"):
            found.setdefault(
                event["attempt"], (str(event["reason"]), float(event.get("silent_seconds") or 0))
            )
    return [found[a] for a in sorted(found)]


HANG = register(
    Scenario(
        name="hang",
        injects="one rank stops making progress without dying, inside a step and inside a checkpoint write "
        "(its peers wait for it inside the collectives)",
        outcome="detected by the hang timeout (4x inside a save), the job restarts and completes; every "
        "sample once; final state identical",
        run=_hang,
        runs=2,
        hang_timeouts=1 + PHASE_FACTOR,  # one in a step, one inside a save
    )
)


def signal_step(context: DrillContext, after: int = 0) -> int:
    """A step past the first save (and past ``after``) to signal at, so a checkpoint exists before it."""
    ref = context.reference
    first = next((s for s in ref.saves if s > after), after)
    return max(1, min(first + 1, ref.steps - 2))


def launch_until_step(
    context: DrillContext, run_dir: str, spec: LaunchSpec, step: int, *, durable: bool = False
) -> tuple[subprocess.Popen[bytes], float, bool]:
    """Launch with every rank pausing a few seconds at ``step``, and return once a rank of this launch has
    recorded it (the pause is the window to signal or kill in); with ``durable``, also once a checkpoint of an
    earlier step is durable (a kill then proves the relaunch resumes, not that it starts over).

    Returns the launch, its start time, and whether the step was reached (False: the launch ended first).
    """
    faults = "; ".join(f for f in (spec.faults, f"slow@step={step},seconds={_WINDOW}") if f)
    # An earlier launch's window at the same step is the same fault (same marker) and would silence this one:
    # this launch's plan starts with none fired.
    shutil.rmtree(os.path.join(run_dir, "faults"), ignore_errors=True)
    before = last_attempt(run_dir)
    started = time.monotonic()
    proc = start_launch(context, run_dir, dataclasses.replace(spec, faults=faults))
    while proc.poll() is None:
        if recorded(run_dir, step, after_attempt=before) and (not durable or durable_before(run_dir, step)):
            return proc, started, True
        time.sleep(0.05)  # polling for the step, not a synchronisation by time
    return proc, started, False


def last_attempt(run_dir: str) -> int:
    """The newest attempt that recorded a step in ``run_dir`` (-1: none yet)."""
    try:
        return max(read_records(run_dir).attempts, default=-1)
    except FileNotFoundError:
        return -1


def durable_before(run_dir: str, step: int) -> bool:
    """Whether a checkpoint of a step before ``step`` is durable: the relaunch has one to resume from."""
    from goodput.ledger import read_events

    events = read_events(run_dir, rank=None)
    return any(e["event"] == "checkpoint_durable" and int(e["step"]) < step for e in events)


def restored_steps(run_dir: str) -> list[int]:
    """The step each rank of each attempt restored (an attempt that found no checkpoint is left out)."""
    from goodput.ledger import read_events

    events = read_events(run_dir, rank=None)
    return [int(e["step"]) for e in events if e["event"] == "restore_end" and e.get("step") is not None]


def recorded(run_dir: str, step: int, *, after_attempt: int) -> bool:
    """Whether a rank of an attempt after ``after_attempt`` recorded ``step`` done (its batch alone: not yet)."""
    try:
        records = read_records(run_dir)
    except (FileNotFoundError, ValueError):
        return False
    return any(
        record.attempt > after_attempt and not record.pending
        for steps in records.steps.values()
        if (record := steps.get(step))
    )


def _preempt(context: DrillContext) -> ScenarioResult:
    run_dir = os.path.join(context.work_dir, "run")
    problems: list[str] = []
    seconds, restored = 0.0, 0
    injected: list[str] = []
    late = 0
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        # The ranks agree on a stop at check steps, the first one right after the step they resumed from
        # (goodput.run.signals): a signal before it is acted on within a step, in a run of any length.
        step = restored + 1
        context.say(f"preempt: {signum.name} to goodput launch at step {step}")
        proc, started, reached = launch_until_step(context, run_dir, LaunchSpec(restarts=0), step)
        if reached:
            proc.send_signal(signum)
        done = finish(proc, started)
        seconds += done.seconds
        saved = _preemption_saves(run_dir, len(injected))
        restored = saved[0] if len(saved) == 1 else restored
        injected.append(
            f"{signum.name} at step {step}: {outcome_text(done.status)}, saved {saved or 'nothing'}"
        )
        if not reached:
            problems.append(f"the run ended before step {step}, where {signum.name} was to be sent")
        elif done.status == 0 and not saved:
            late += 1  # the job completed before the ranks' next check: done, nothing lost (exit 0)
        elif done.status != EXIT_PREEMPTED:
            problems.append(
                f"{signum.name}: ended {outcome_text(done.status)}, expected exit {EXIT_PREEMPTED}"
            )
        elif len(saved) != 1:
            problems.append(f"{signum.name}: the ranks saved steps {saved}, expected one agreed step")
        elif said(run_dir, f"preempted by {signum.name}") != 1:
            problems.append(f"{signum.name}: goodput launch did not say in one line where it saved")
        if left := processes_of(run_dir):
            problems.append(f"{signum.name}: {len(left)} process(es) of the job outlived the launch")
    if late == len(injected):
        problems.append("no signal was acted on: every launch completed before its ranks' check")
    context.say("preempt: the same command again, to the end")
    done = run_launch(context, run_dir, LaunchSpec(restarts=0))
    return result(
        context, run_dir, injected="; ".join(injected), status=done.status, seconds=seconds + done.seconds,
        problems=problems,
    )  # fmt: skip


def said(run_dir: str, words: str, log: str = OUTPUT_LOG) -> int:
    """How many of goodput launch's own lines in the run's output (``log``) contain ``words``."""
    with open(os.path.join(run_dir, log), errors="replace") as f:
        return sum(1 for line in f if line.startswith("goodput launch:") and words in line)


def _preemption_saves(run_dir: str, launch: int) -> list[int]:
    """The distinct steps the ranks saved on the ``launch``-th preemption (one: they agreed)."""
    from goodput.ledger import read_events

    events = [e for e in read_events(run_dir, rank=None) if e["event"] == "preempted"]
    by_attempt: dict[int, set[int]] = {}
    for event in events:
        by_attempt.setdefault(int(event["attempt"]), set()).add(int(event["step"]))
    attempts = sorted(by_attempt)
    return sorted(by_attempt[attempts[launch]]) if launch < len(attempts) else []


PREEMPT = register(
    Scenario(
        name="preempt",
        injects="SIGTERM to goodput launch, then the scheduler's early-warning signal (SIGUSR1) after a "
        "relaunch",
        outcome="each: one agreed save, exit 75 (exit 0 when the job completes before its ranks' next "
        "check); the same command again resumes; every sample once; final state identical",
        run=_preempt,
        runs=3,
    )
)
