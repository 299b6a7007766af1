"""What most scenarios share: launching the script under ``goodput launch`` with a fault plan, judging what it
recorded against the uninterrupted reference, and the ledger's account of the time it took.

Each launch is a real ``python -m goodput launch`` process (a scenario may signal it, as a scheduler would), with
``GOODPUT_RECORDS=1`` so ``Run`` records every step; its output goes to ``output.log`` in its run folder.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from goodput._lifetime import end_with_parent, preload_libc
from goodput.drill.scenario import DrillContext, ScenarioResult
from goodput.verify.compare import compare_records
from goodput.verify.records import RECORDS_ENV, RunRecords, read_records
from goodput.verify.session import raise_if_stopped, started

__all__ = [
    "OUTPUT_LOG",
    "Finished",
    "Judgement",
    "LaunchSpec",
    "finish",
    "judge",
    "largest_losses",
    "ledger_account",
    "outcome_text",
    "processes_of",
    "result",
    "run_launch",
    "start_launch",
]

OUTPUT_LOG = "output.log"
_TIMEOUT = 600.0  # seconds one launch of a drill may take before it counts as hung


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """One ``goodput launch`` of the drilled script.

    Attributes:
        faults: the fault plan (``goodput.faults`` syntax), ``GOODPUT_FAULTS`` of every rank.
        restarts: ``--max-restarts``.
        warm: ``--restart warm`` (one hot spare).
        flags: more ``goodput launch`` flags (``("--grace", "30s")``).
        env: more environment for the launcher and its workers.
        nodes: the nodes of the job this launch is one node of (its rendezvous in ``flags``); 1: a launch of
            every rank (``nproc`` x ``nnodes`` of the drill) on this node.
        log: the file in the run folder its output goes to.
        limit: the seconds it may take before it counts as hung and is killed; None: no limit (a soak's
            uninterrupted run, as long as the soak).
    """

    faults: str = ""
    restarts: int = 3
    warm: bool = False
    flags: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    nodes: int = 1
    log: str = OUTPUT_LOG
    limit: float | None = _TIMEOUT


@dataclasses.dataclass(frozen=True)
class Finished:
    """A launch that ended: its exit status and wall time."""

    status: int
    seconds: float


def start_launch(context: DrillContext, run_dir: str, spec: LaunchSpec) -> subprocess.Popen[bytes]:
    """Start ``goodput launch`` of ``context.script`` into ``run_dir``; its output goes to ``run_dir/<spec.log>``.

    Every launch trains the drill's whole world (``nproc`` x ``nnodes`` ranks), on one node or on ``spec.nodes``.

    Raises:
        Stopped: the drill was asked to stop: no launch starts.
    """
    os.makedirs(run_dir, exist_ok=True)
    nproc = context.nproc * context.nnodes // spec.nodes
    command = [
        sys.executable, "-m", "goodput", "launch", "--nproc", str(nproc), "--run-dir", run_dir,
        "--max-restarts", str(spec.restarts), "--crash-loop", str(spec.restarts + 1), "--verbose",
        *(["--restart", "warm", "--spares", "1"] if spec.warm else []), *(["--faults", spec.faults] if spec.faults else []),
        *spec.flags, "--", *context.script,
    ]  # fmt: skip
    env = {**os.environ, RECORDS_ENV: "1", **spec.env}
    raise_if_stopped()
    drill = os.getpid()
    preload_libc()  # the child between fork and exec only calls into it
    with open(os.path.join(run_dir, spec.log), "ab") as log:
        # A session of its own: a terminal's Ctrl-C reaches it once, passed on by the drill (goodput.verify.session);
        # a SIGKILLed drill takes it, and so its job, with it.
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True, preexec_fn=lambda: end_with_parent(drill),
        )  # fmt: skip
    return started(proc)


def finish(proc: subprocess.Popen[bytes], began: float, limit: float | None = _TIMEOUT) -> Finished:
    """Wait for a launch to end (at most ``limit`` seconds from ``began``: then it is killed, status -9).

    Raises:
        Stopped: the drill was asked to stop meanwhile (the launch stopped too).
    """
    try:
        status = proc.wait(timeout=None if limit is None else max(1.0, limit - (time.monotonic() - began)))
    except subprocess.TimeoutExpired:
        proc.kill()
        status = proc.wait()
    raise_if_stopped()
    return Finished(status, time.monotonic() - began)


def run_launch(context: DrillContext, run_dir: str, spec: LaunchSpec) -> Finished:
    """Launch the script into ``run_dir`` and wait for it to end."""
    began = time.monotonic()
    return finish(start_launch(context, run_dir, spec), began, spec.limit)


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A run's records against the reference's: samples exactly once, final state identical, and why not."""

    exactly_once: bool
    identical: bool
    problems: tuple[str, ...]


def judge(context: DrillContext, run_dir: str) -> Judgement:
    """Compare what ``run_dir``'s ranks recorded with the reference run, step by step and the final state.

    Exactly once: every rank trained, as its last (surviving) time, the same samples at every step as the
    uninterrupted run, and no other step. Identical: no difference at all (losses, generators, final state).
    """
    try:
        records = read_records(run_dir)
    except FileNotFoundError:
        return Judgement(False, False, ("the run recorded no step",))
    reference = context.reference.records
    exactly_once = _same_samples(reference, records)
    differences = compare_records(reference, records)
    problems = tuple(str(d) for d in differences)
    if not exactly_once and not problems:
        problems = ("the samples trained differ from the uninterrupted run's",)
    return Judgement(exactly_once, not differences, problems)


def _same_samples(reference: RunRecords, other: RunRecords) -> bool:
    if set(reference.steps) != set(other.steps):
        return False
    for rank, steps in reference.steps.items():
        got = other.steps[rank]
        if set(steps) != set(got):
            return False
        if any((steps[s].samples, steps[s].count) != (got[s].samples, got[s].count) for s in steps):
            return False
    return True


def ledger_account(run_dir: str) -> str:
    """The ledger's account of a run in a few words: attempts, launches, goodput and where the rest went."""
    from goodput.ledger import read_events
    from goodput.ledger.accounting import account

    try:
        events = read_events(run_dir, rank=None)
    except FileNotFoundError:
        return "no ledger"
    if not events:
        return "no ledger"
    acc = account(events)
    parts = [f"{len(acc.attempts)} attempt{'s' if len(acc.attempts) != 1 else ''}"]
    if acc.launches > 1:
        parts.append(f"{acc.launches} launches")
    parts.append(f"goodput {acc.goodput:.0%}")
    if biggest := largest_losses(acc.categories, 3):
        parts.append(biggest)
    return "; ".join(parts)


def largest_losses(categories: Mapping[str, float], most: int) -> str:
    """The ``most`` ledger categories that lost the most time (0.05 s or more), as ``name 1.2s, ...``; empty
    when none did. Productive time and the time between launches are no loss."""
    lost = {k: v for k, v in categories.items() if k not in ("productive", "between_launches") and v >= 0.05}
    return ", ".join(f"{k} {v:.1f}s" for k, v in sorted(lost.items(), key=lambda kv: -kv[1])[:most])


def outcome_text(status: int) -> str:
    """``completed`` for exit 0, ``stopped, exit N`` otherwise (a negative status: killed by signal -N)."""
    if status == 0:
        return "completed"
    if status < 0:
        return f"killed by signal {-status}"
    return f"stopped, exit {status}"


def result(
    context: DrillContext,
    run_dir: str,
    *,
    injected: str,
    status: int,
    seconds: float,
    expected_status: int = 0,
    identical_expected: str = "",
    problems: Sequence[str] = (),
) -> ScenarioResult:
    """The usual row: the run ended with ``expected_status``, trained every sample exactly once and, unless
    ``identical_expected`` names why not, ends identical to the reference; ``problems`` are more failed checks.

    ``seconds`` is the scenario's wall time over all its launches; time lost is its excess over the reference.
    """
    verdict = judge(context, run_dir)
    found = list(problems)
    if status != expected_status:
        found.insert(0, f"ended {outcome_text(status)}, expected {outcome_text(expected_status)}")
    if not verdict.exactly_once or (not identical_expected and not verdict.identical):
        found.extend(verdict.problems[:1])
    return ScenarioResult(
        injected=injected,
        outcome=outcome_text(status),
        met=not found,
        exactly_once=verdict.exactly_once,
        identical=None if identical_expected else verdict.identical,
        not_expected=identical_expected,
        time_lost=max(0.0, seconds - context.reference.seconds),
        ledger=ledger_account(run_dir),
        problems=tuple(found),
    )


def processes_of(run_dir: str) -> list[int]:
    """Live processes whose environment names ``run_dir`` as ``GOODPUT_RUN_DIR``: what is left of a job."""
    needle = f"GOODPUT_RUN_DIR={os.path.abspath(run_dir)}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            found.append(int(name))
    return found
