"""``goodput drill --soak DURATION``: one long job under warm restarts, faults of every mixable kind arriving at
random, and at the end: nothing lost, nothing twice, nothing leaked, and the ledger's account per fault kind.

The script runs once briefly uninterrupted to measure its step time (the built-in one for 60 steps, a user's
script as it is); the schedule is drawn from it (:mod:`goodput.drill.soak_plan`), the built-in script is sized
to train for DURATION (a user's script trains its own length, the schedule spread over it). The job then runs
under ``goodput launch --restart warm`` with the schedule's fault plan; the soak sends each preemption's SIGTERM
itself once the job has trained past its step, and runs the same command again after it, as a scheduler would;
so for a SIGKILL of the warm agent or of ``goodput launch`` (after which no process of the job may be left).
A thread samples the job's processes and the node meanwhile (:mod:`goodput.drill.soak_leaks`); with store faults
in the schedule, another opens their windows on the S3 server the durable tier then saves to
(:mod:`goodput.drill.soak_store`). A violation
stops the soak at once and writes :data:`~goodput.drill.soak_plan.REPLAY_FILE` in the current folder, which
``goodput drill --soak --replay FILE`` runs again with the same schedule.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from goodput.drill.drill import DEMO_SCRIPT, reference_run
from goodput.drill.runs import LaunchSpec, start_launch
from goodput.drill.scenario import DrillContext, Reference
from goodput.drill.soak_plan import (
    KINDS,
    REPLAY_FILE,
    SENT,
    STORE,
    Checks,
    SoakFault,
    SoakPlan,
    draw_schedule,
    fault_plan,
    read_replay,
    soak_kinds,
)
from goodput.drill.soak_report import Outcome, judge_run, print_tables
from goodput.drill.soak_store import measuring_store, store_missing
from goodput.drill.supervisors import agent_pid, left_after
from goodput.errors import ConfigError
from goodput.job.codes import EXIT_PREEMPTED

if TYPE_CHECKING:
    from goodput.drill.soak_leaks import Sampler
from goodput.verify.records import RunRecords

__all__ = ["CALIBRATION_STEPS", "SAMPLES_FILE", "soak"]

SAMPLES_FILE = "soak-samples.jsonl"  # in the work folder: every reading of the sampler
CALIBRATION_STEPS = 60  # the built-in script's steps in the run that measures its step time
_POLL = (
    0.2  # seconds between the soak's looks at the job (markers, attempts, the step a preemption waits for)
)


def soak(
    script: Sequence[str],
    *,
    duration: float | None,
    mtbf: float,
    seed: int,
    nproc: int,
    work_dir: str,
    replay: str | None = None,
    kinds: Sequence[str] = KINDS,
    reference: bool = False,
    nnodes: int = 1,
    say: Callable[[str], None] = print,
) -> int:
    """Soak ``script`` (the built-in demo when empty) for ``duration`` seconds with a fault every ``mtbf``
    seconds on average (or the schedule of the ``replay`` file), of the given ``kinds``; 0 when every check held,
    1 on a violation (the replay file written in the current folder). The final lineage is compared with the
    same command's uninterrupted run: a script of yours has it from measuring its step time; the built-in
    script, sized to the soak, runs it first only with ``reference`` (it doubles the time). With ``nnodes`` 2
    the job runs as two node launches on this machine (:mod:`goodput.drill.soak_nodes`).

    Raises:
        ConfigError: a missing script or replay file, a non-empty work folder, a duration or mtbf out of range,
            an unknown kind.
    """
    if nnodes not in (1, 2):
        raise ConfigError(f"--soak runs on --nnodes 1 or 2, got {nnodes}")
    known = soak_kinds(nnodes)
    if (unknown := sorted(set(kinds) - set(known))) or not kinds:
        raise ConfigError(
            f"--kinds {','.join(unknown) or '(none)'}: not a soak's fault kind on {nnodes} node(s) "
            f"({', '.join(known)})"
        )
    if os.path.isdir(work_dir) and os.listdir(work_dir):
        raise ConfigError(f"{work_dir} is not empty (an earlier drill?): choose an empty --work-dir")
    os.makedirs(work_dir, exist_ok=True)
    uninterrupted: Reference | None = None
    if replay is not None:
        plan, script = _replayed(replay, script)
        if unknown := sorted({f.kind for f in plan.schedule} - set(known)):
            raise ConfigError(
                f"--replay {replay}: {', '.join(unknown)} is not a soak's fault kind on {nnodes} node(s) "
                f"({', '.join(known)})"
            )
    else:
        if duration is None or duration <= 0 or mtbf <= 0:
            raise ConfigError(f"need --soak DURATION > 0 and --mtbf > 0, got {duration} and {mtbf}")
        script = tuple(script) or (DEMO_SCRIPT,)
        drawn = _draw(
            script, duration=duration, mtbf=mtbf, seed=seed, nproc=nproc, nnodes=nnodes, work=work_dir,
            kinds=kinds, say=say,
        )  # fmt: skip
        if drawn is None:
            return 1
        plan, script, uninterrupted = drawn
    if script[0].endswith(".py") and not os.path.isfile(script[0]):
        raise ConfigError(f"the training script {script[0]!r} does not exist")
    say(
        f"soak: {' '.join(script)}, {nproc} ranks x {nnodes} node(s), --restart warm, {plan.steps} steps (about {plan.seconds:.0f}s "
        f"of training at {plan.step_seconds * 1000:.1f} ms a step), {len(plan.schedule)} faults (seed "
        f"{plan.seed}, mtbf {plan.mtbf:g}s), in {work_dir}"
    )
    for n, fault in enumerate(plan.schedule, 1):
        say(f"  {n}. {fault.text()}")
    if uninterrupted is None and reference and script[0] == DEMO_SCRIPT:
        say(f"soak: the reference: {' '.join(script)} once, uninterrupted ...")
        uninterrupted = reference_run(
            script,
            nproc=nproc,
            nnodes=nnodes,
            seed=plan.seed,
            work=os.path.join(work_dir, "reference"),
            say=say,
            limit=None,  # as long as the soak: no drill limit
        )
        if uninterrupted is None:
            return 1
    records = uninterrupted.records if uninterrupted is not None else None
    if nnodes == 2:
        from goodput.drill.soak_nodes import run_two_nodes

        outcome = run_two_nodes(plan, script, nproc=nproc, work=work_dir, reference=records, say=say)
    else:
        outcome = _run(plan, script, nproc=nproc, work=work_dir, reference=records, say=say)
    print_tables(outcome, plan)
    if not outcome.violations:
        return 0
    path = os.path.abspath(REPLAY_FILE)
    with open(path, "w") as f:
        json.dump(
            {**plan.to_json(outcome.violations[0]), "script": list(script), "nnodes": nnodes}, f, indent=2
        )
    for line in outcome.violations:
        say(f"soak: VIOLATION: {line}")
    say(f"soak: the schedule is in {path}: 'goodput drill --soak --replay {REPLAY_FILE}' runs it again")
    return 1


def _replayed(path: str, script: Sequence[str]) -> tuple[SoakPlan, tuple[str, ...]]:
    plan = read_replay(path)
    if script:
        return plan, tuple(script)
    with open(path) as f:
        recorded = json.load(f).get("script") or [DEMO_SCRIPT, "--steps", str(plan.steps)]
    return plan, tuple(str(a) for a in recorded)


def _draw(
    script: tuple[str, ...], *, duration: float, mtbf: float, seed: int, nproc: int, nnodes: int, work: str,
    kinds: Sequence[str], say: Callable[[str], None],
) -> tuple[SoakPlan, tuple[str, ...], Reference | None] | None:  # fmt: skip
    """Measure the script's step time in an uninterrupted run and draw the schedule from it; that run is the
    reference of a script of the user's (it ran as the soak will), of the built-in script none (60 steps). On
    two nodes the built-in script keeps its global batch through a shrink (``--global-batch``)."""
    from goodput.drill.soak_nodes import demo_global_batch, draw_two_nodes

    demo = script[0] == DEMO_SCRIPT
    if demo and nnodes == 2:
        script = (*script, "--global-batch", str(demo_global_batch(nproc)))
    measured = (*script, "--steps", str(CALIBRATION_STEPS)) if demo else script
    if missing := store_missing(kinds):
        kinds = [k for k in kinds if k not in STORE]
        say(f"soak: no store faults ({', '.join(STORE)}): {missing}")
    say(f"soak: measuring the step time: {' '.join(measured)} once, uninterrupted ...")
    with measuring_store(kinds) as env:  # the store faults' soak saves to S3: measured so too
        reference = reference_run(  # a script of the user's: as long as the soak, so no drill limit
            measured, nproc=nproc, nnodes=nnodes, seed=seed, work=work, say=say, env=env, limit=None
        )
    if reference is None:
        return None
    step_seconds, first, checks, rollbacks = _measured(reference)
    if "bitflip" in kinds and checks is None:
        kinds = [k for k in kinds if k != "bitflip"]
        say("soak: no bit flips: the script's guard compares no replicas (NumericConfig(check_every=N) does)")
    steps = max(int(duration / step_seconds), first + 3) if demo else reference.steps
    if not demo and steps * step_seconds < duration:
        say(
            f"soak: the script trains {steps} steps, about {steps * step_seconds:.0f}s: the faults are spread over "
            f"those (a longer soak needs a longer run of the script)"
        )
    seconds = min(duration, steps * step_seconds)
    if nnodes == 2:
        schedule = draw_two_nodes(
            seed=seed, mtbf=mtbf, seconds=seconds, step_seconds=step_seconds, steps=steps, first_step=first,
            nproc=nproc, kinds=kinds, checks=checks, rollbacks=rollbacks,
        )  # fmt: skip
    else:
        schedule = draw_schedule(
            seed=seed, mtbf=mtbf, seconds=seconds, step_seconds=step_seconds, steps=steps, first_step=first,
            world=nproc, kinds=kinds, checks=checks, rollbacks=rollbacks,
        )  # fmt: skip
    if not schedule:
        raise ConfigError(
            f"no fault falls within the script's {seconds:.0f}s of training at --mtbf {mtbf:g}s, so the soak would "
            f"test nothing: give the script about {duration / step_seconds:.0f} steps for a {duration:.0f}s soak, "
            f"or a shorter --mtbf"
        )
    plan = SoakPlan(
        seed=seed, mtbf=mtbf, seconds=seconds, steps=steps, step_seconds=step_seconds, schedule=schedule
    )
    if demo:
        return plan, (*script, "--steps", str(steps)), None
    return plan, script, reference


def _measured(reference: Reference) -> tuple[float, int, Checks | None, tuple[int, int] | None]:
    """(seconds per step while training, the first step a fault may hit: past the first save and the spike
    rule's warm-up, the guard's replica checks or None, its ``(max_rollbacks, rollback_window)`` or None) of the
    uninterrupted run."""
    from goodput.ledger import read_events
    from goodput.ledger.accounting import account

    events = read_events(reference.run_dir, rank=None)
    acc = account(events)
    training = (
        acc.job_seconds - acc.categories.get("init", 0.0) - acc.categories.get("checkpoint_restore", 0.0)
    )
    configs = [e for e in events if e["event"] == "numeric_config"]
    warmups = [int(e.get("spike_warmup") or 0) for e in configs]
    first_save = min(reference.saves, default=0)
    first = max([first_save, *warmups]) + 2
    every = int(configs[0].get("check_every") or 0) if configs else 0
    checks = Checks(every=every, first=-(-first_save // every) * every) if every > 0 else None
    most, window = (
        (configs[0].get("max_rollbacks"), configs[0].get("rollback_window")) if configs else (None, None)
    )
    rollbacks = (int(most), int(window)) if most is not None and window is not None else None
    return max(training / max(reference.steps, 1), 1e-4), first, checks, rollbacks


@dataclasses.dataclass
class _Watch:
    """What the soak has seen of the job so far, for its progress lines and its account."""

    began: float
    markers: set[str] = dataclasses.field(default_factory=set)
    attempts: set[str] = dataclasses.field(default_factory=set)
    sent: list[SoakFault] = dataclasses.field(default_factory=list)  # still to send, in step order
    # the kind of fault that ended each launch but the last
    relaunched: list[str] = dataclasses.field(default_factory=list)
    violation: str = ""


def _watching(plan: SoakPlan, run_dir: str, program: str) -> tuple[_Watch, Sampler]:
    """The soak's watch of the job, and its leak sampler started (a warm-up of a sixth of the plan, 10-600 s)."""
    from goodput.drill.soak_leaks import Sampler

    watch = _Watch(began=time.monotonic(), sent=[f for f in plan.schedule if f.kind in SENT])
    sampler = Sampler(
        run_dir, program, clock=lambda: time.monotonic() - watch.began,
        warmup=max(10.0, min(600.0, plan.seconds / 6)),
    )  # fmt: skip
    sampler.start()
    return watch, sampler


def _run(
    plan: SoakPlan, script: tuple[str, ...], *, nproc: int, work: str, reference: RunRecords | None,
    say: Callable[[str], None],
) -> Outcome:  # fmt: skip
    from goodput.drill.soak_store import StoreFaults

    run_dir = os.path.join(work, "soak")
    store = StoreFaults(plan.schedule, latest=lambda: _latest_step(run_dir, since=0.0), say=say)
    store_env = store.begin()  # the durable tier on the faulty store, when the schedule holds a store fault
    empty = Reference.empty()
    context = DrillContext(
        script=script, nproc=nproc, nnodes=1, seed=plan.seed, work_dir=work, reference=empty, say=say
    )
    spec = LaunchSpec(
        faults=fault_plan(plan.schedule), restarts=len(plan.schedule) + 2, warm=True, env=store_env
    )
    watch, sampler = _watching(plan, run_dir, script[0])
    status = 0
    try:
        for _ in range(len(watch.sent) + 1):
            proc = start_launch(context, run_dir, spec)
            status, fault = _follow(proc, run_dir, watch, lambda: sampler.leaked, plan, say)
            if (
                fault is None
                or sampler.leaked
                or watch.violation
                or not _ended_by(fault, status, run_dir, watch)
            ):
                break
            watch.relaunched.append(fault.kind)
            say(
                f"[{time.monotonic() - watch.began:6.1f}s] {fault.kind} ended the launch (exit {status}): the same command again"
            )
    finally:
        store.end()
        sampler.stop()
        sampler.save(os.path.join(work, SAMPLES_FILE))
    return judge_run(
        plan, run_dir, status=status, seconds=time.monotonic() - watch.began, sampler=sampler,
        stopped=watch.violation, relaunched=tuple(watch.relaunched), reference=reference, store=store.windows,
    )  # fmt: skip


def _ended_by(fault: SoakFault, status: int, run_dir: str, watch: _Watch) -> bool:
    """Whether the launch ended as ``fault`` ends one (then the soak runs the command again); a killed agent or
    launcher leaves no process of the job behind, else that is the violation."""
    if fault.kind == "preempt":
        return status == EXIT_PREEMPTED
    if left := left_after(run_dir):
        watch.violation = (
            f"{len(left)} process(es) of the job outlived the SIGKILL of the {fault.kind}: {left}"
        )
        return False
    return status != 0


def _follow(
    proc: subprocess.Popen[bytes], run_dir: str, watch: _Watch, leaked: Callable[[], str], plan: SoakPlan,
    say: Callable[[str], None],
) -> tuple[int, SoakFault | None]:  # fmt: skip
    """Watch one launch to its end: a line per fault fired and per attempt begun, the next fault the soak sends
    itself once the job has trained past its step, and the launch stopped at once on a leak. Returns the
    launch's exit status and the fault the soak sent it (None: none)."""
    started = time.time()
    started_mono = time.monotonic()
    limit = started_mono + 600.0 + 10 * plan.seconds
    sent: SoakFault | None = None
    while proc.poll() is None:
        time.sleep(_POLL)  # polling the job's folder, not a synchronisation by time
        _report_progress(run_dir, watch, plan, say)
        if leaked() or time.monotonic() > limit:
            watch.violation = leaked() or f"the job ran past {limit - started_mono:.0f}s"
            say(f"[{time.monotonic() - watch.began:6.1f}s] stopping the job at once: {watch.violation}")
            for _ in range(2):  # a second signal stops goodput launch at once
                proc.send_signal(signal.SIGTERM)
            break
        due = sent is None and watch.sent and _latest_step(run_dir, since=started) >= watch.sent[0].step
        if due and _send(watch.sent[0], proc, run_dir):
            sent = watch.sent.pop(0)
            say(f"[{time.monotonic() - watch.began:6.1f}s] injected: {sent.text()}")
    return proc.wait(), sent


def _send(fault: SoakFault, proc: subprocess.Popen[bytes], run_dir: str) -> bool:
    """Send ``fault`` to the launch; False when its target is not there yet (the agent between generations)."""
    if fault.kind == "preempt":
        proc.send_signal(signal.SIGTERM)
    elif fault.kind == "launcher":
        proc.send_signal(signal.SIGKILL)
    elif (pid := agent_pid(run_dir)) is not None:
        os.kill(pid, signal.SIGKILL)
    else:
        return False
    return True


def _report_progress(run_dir: str, watch: _Watch, plan: SoakPlan, say: Callable[[str], None]) -> None:
    at = f"[{time.monotonic() - watch.began:6.1f}s]"
    folder = os.path.join(run_dir, "faults")
    for name in sorted(set(os.listdir(folder)) - watch.markers if os.path.isdir(folder) else ()):
        watch.markers.add(name)
        fault = name.rsplit("-rank", 1)[0].rsplit("#", 1)[0]
        if "@" in fault and not any(m.startswith(fault + "#") for m in watch.markers - {name}):
            say(f"{at} injected: {fault}")
    ledger = os.path.join(run_dir, "ledger")
    for name in sorted(set(os.listdir(ledger)) - watch.attempts if os.path.isdir(ledger) else ()):
        watch.attempts.add(name)
        if name.endswith(".index") and not name.startswith("attempt-0000"):
            say(f"{at} recovering: {name.split('.')[0]} began, at step {_latest_step(run_dir, since=0.0)}")


def _latest_step(run_dir: str, *, since: float) -> int:
    """The last step a rank recorded in a records file written after ``since`` (wall time); -1: none."""
    from goodput.run.records import RECORDS_DIR

    folder = os.path.join(run_dir, RECORDS_DIR)
    latest = -1
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        path = os.path.join(folder, name)
        try:
            if not name.startswith("attempt-") or os.path.getmtime(path) < since:
                continue
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 4096))
                lines = f.read().splitlines()[1 if f.tell() > 4096 else 0 :]
        except OSError:
            continue
        for line in reversed(lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "step" in record and not record.get("pending"):
                latest = max(latest, int(record["step"]))
                break
    return latest
