"""``goodput verify-resume -- train.py``: a user's script run twice under ``goodput launch``, compared.

The first run is uninterrupted; the second is SIGKILLed at random steps and inside checkpoint writes, async
uploads and restores (the fault plan, drawn from where the first run saved). Both run with
``GOODPUT_RECORDS=1``, so ``Run`` records each step's samples, loss and random generators and the final
state (:mod:`goodput.verify.records`); :func:`~goodput.run.compare.compare_records` names the first difference.
The workers' output (tracebacks of the ranks that survive a kill included) goes to ``output.log`` in each
run folder, so nothing but the verdict reaches the terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from goodput.errors import ConfigError
from goodput.launch.launcher import LaunchConfig, launch_job
from goodput.verify.compare import compare_records, idle_generators
from goodput.verify.records import RECORDS_ENV, RunRecords, read_records
from goodput.verify.session import raise_if_stopped

__all__ = [
    "empty_folders",
    "environment",
    "kill_plan",
    "launch_config",
    "records_of",
    "run_captured",
    "saved_steps",
    "verify_resume",
]

OUTPUT_LOG = "output.log"


@contextlib.contextmanager
def _captured_output(path: str) -> Iterator[None]:
    """Send this process's stdout and stderr, and so its children's, to the file ``path`` meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        for fd in saved:
            os.close(fd)


@contextlib.contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """``name`` set to ``value`` in this process's environment (and so its launches') meanwhile."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def run_captured(
    run: Callable[[], int], run_dir: str, name: str, say: Callable[[str], None], *, records: bool = True
) -> bool:
    """Run one launch with its output in ``run_dir/output.log`` (and ``Run``'s records on); say why it failed.

    Raises:
        Stopped: the command was asked to stop, before the launch or while it ran (it stopped too).
        ConfigError: a rank stopped on a ConfigError (the script refused its configuration): that error.
    """
    raise_if_stopped()
    os.makedirs(run_dir, exist_ok=True)
    log = os.path.join(run_dir, OUTPUT_LOG)
    with environment(RECORDS_ENV, "1" if records else "0"), _captured_output(log):
        status = run()
    raise_if_stopped()
    if status == 0:
        return True
    tail = _tail(log, 8)
    for line in tail:  # the script refused its configuration (a user error): that line, not a failed run
        if (found := _CONFIG_STOP.search(line)) is not None:
            raise ConfigError(f"the {name} run stopped: {found[1]}: {found[2]}")
    say(f"the {name} run failed with exit status {status}; its output is in {log}, ending:")
    for line in tail:
        say(f"  | {line}")
    return False


# The launcher's line for a rank that stopped on a ConfigError (goodput.launch.supervise): a restart cannot fix it.
_CONFIG_STOP = re.compile(
    r"goodput launch: stopped: (rank \d+): ConfigError: (.*?); a restart cannot fix this"
)


def _tail(path: str, lines: int) -> list[str]:
    with open(path, errors="replace") as f:
        return [line.rstrip("\n") for line in f.readlines()[-lines:]]


def verify_resume(
    script: Sequence[str],
    *,
    nproc: int,
    kills: int,
    seed: int,
    work_dir: str | None,
    say: Callable[[str], None] = print,
    restart: str = "cold",
    spares: int = 1,
) -> int:
    """Run ``script`` uninterrupted and with ``kills`` SIGKILLs; 0 when identical, 1 with the difference.

    ``restart="warm"`` runs both under the warm-restart agent (``goodput launch --restart warm``, ``spares``
    hot spares).

    Raises:
        ConfigError: the script is missing, a flag is out of range, or the script does not use ``Run``.
    """
    _check(script, nproc=nproc, kills=kills)
    work, dirs = empty_folders(work_dir, ("uninterrupted", "interrupted"))
    clean_dir, killed_dir = dirs["uninterrupted"], dirs["interrupted"]
    say(f"goodput verify-resume: {' '.join(script)}, {nproc} ranks, {restart} restarts, in {work}")

    def launch(run_dir: str, faults: str, restarts: int) -> Callable[[], int]:
        config = launch_config(script, nproc, run_dir, faults=faults, restarts=restarts)
        if restart == "warm":
            from goodput.warm.agent import WarmConfig, launch_warm

            return lambda: launch_warm(config, WarmConfig(spares=spares))
        return lambda: launch_job(config)

    if not run_captured(launch(clean_dir, "", 0), clean_dir, "uninterrupted", say):
        return 1
    reference = records_of(clean_dir, script)
    steps = max(max(steps, default=0) for steps in reference.steps.values())
    saves, async_saves = saved_steps(clean_dir)
    plan = kill_plan(
        kills, steps=steps, saves=saves, nproc=nproc, seed=seed, async_saves=async_saves,
        inside_steps=restart == "warm",
    )  # fmt: skip
    say(f"uninterrupted: {steps} steps, saved at {_steps_text(saves)}; faults: {plan or 'none'}")
    # Under the warm agent a script that does not hand its training to run.warm loses its survivor too: each
    # kill is then a warm restart and the cold one that follows it.
    budget = 2 * kills + 2 if restart == "warm" else kills + 2
    if not run_captured(launch(killed_dir, plan, budget), killed_dir, "interrupted", say):
        return 1
    return _verdict(reference, records_of(killed_dir, script), killed_dir, say)


def empty_folders(work_dir: str | None, names: Sequence[str]) -> tuple[str, dict[str, str]]:
    """The work folder (``work_dir``, or a new temporary one) and a run folder in it for each of ``names``.

    Raises:
        ConfigError: a run folder exists already (an earlier verify's: its records would mix with these).
    """
    work = work_dir or tempfile.mkdtemp(prefix="goodput-verify-")
    dirs = {name: os.path.join(work, name) for name in names}
    for folder in dirs.values():
        if os.path.exists(folder):
            raise ConfigError(f"{folder} already exists (an earlier verify?): choose an empty --work-dir")
    return work, dirs


def launch_config(
    script: Sequence[str], nproc: int, run_dir: str, *, faults: str = "", restarts: int = 0
) -> LaunchConfig:
    """The launch of one of verify's runs: ``restarts`` restarts, crash-loop detection only past them, and
    every worker's output (it goes to the run's ``output.log``, see ``run_captured``)."""
    return LaunchConfig(
        script=tuple(script), nproc=nproc, max_restarts=restarts, run_dir=run_dir, faults=faults,
        crash_loop=restarts + 1, rdzv_id="goodput-verify", verbose=True,
    )  # fmt: skip


def kill_plan(
    kills: int,
    *,
    steps: int,
    saves: Sequence[int],
    nproc: int,
    seed: int,
    async_saves: bool,
    inside_steps: bool = False,
) -> str:
    """A fault plan of ``kills`` SIGKILLs at seeded random points of a run of ``steps`` steps.

    Even-numbered kills land after random steps past the first save (so the restart resumes from a checkpoint);
    odd-numbered ones inside a checkpoint write, an async upload (with async saves) and a restore, in turn, at
    a step where the uninterrupted run saved (``saves``). ``inside_steps`` (warm restarts): every other
    even-numbered kill lands inside its step instead, right after the rank's optimizer step (phase
    ``optimizer_step``): its gradients are in its peers' step, which the job adopts.
    """
    rng = np.random.default_rng(seed)
    first = min(saves, default=0)
    low = first + 1 if first + 1 < steps else 1
    phases = ["checkpoint_write", *(["async_upload"] if async_saves else []), "restore"]
    points = [s for s in saves if s < steps] or list(saves)
    faults = []
    for n in range(kills):
        rank = int(rng.integers(nproc))
        if n % 2 == 1 and points:
            phase = phases[(n // 2) % len(phases)]
            if phase == "restore":
                faults.append(f"kill@phase=restore,rank={rank},attempt={n}")
            else:
                faults.append(f"kill@phase={phase},step={int(rng.choice(points))},rank={rank}")
        else:
            step = int(rng.integers(low, max(steps, low + 1)))
            inside = inside_steps and n % 4 == 2
            faults.append(
                f"kill@phase=optimizer_step,step={step},rank={rank}"
                if inside
                else f"kill@step={step},rank={rank}"
            )
    return "; ".join(faults)


def _check(script: Sequence[str], *, nproc: int, kills: int) -> None:
    if not script:
        raise ConfigError(
            "give the training script after '--', e.g. goodput verify-resume -- train.py --lr 1e-3"
        )
    if script[0].endswith(".py") and not os.path.isfile(script[0]):
        raise ConfigError(f"the training script {script[0]!r} does not exist")
    if nproc < 1 or kills < 0:
        raise ConfigError(f"need --nproc >= 1 and --kills >= 0, got --nproc {nproc} --kills {kills}")


def records_of(run_dir: str, script: Sequence[str]) -> RunRecords:
    """What ``Run`` recorded in ``run_dir``; a script that recorded no step is refused (it does not use Run)."""
    try:
        records = read_records(run_dir)
    except FileNotFoundError:
        records = RunRecords(steps={}, final={}, attempts=[])
    if not any(records.steps.values()):
        raise ConfigError(
            f"{script[0]} recorded no step: train with goodput.Run and call run.step_done() after each step"
        )
    return records


def saved_steps(run_dir: str) -> tuple[list[int], bool]:
    """The steps the run saved at (durable), and whether its saves were asynchronous."""
    from goodput.ledger import read_events

    events = read_events(run_dir)
    saves = sorted({int(e["step"]) for e in events if e["event"] == "checkpoint_durable"})
    strategies = {e.get("strategy") for e in events if e["event"] == "checkpoint_config"}
    return saves, "dcp_async" in strategies


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return "no step"
    shown = ", ".join(map(str, steps[:8]))
    return shown + (f", ... ({len(steps)} saves)" if len(steps) > 8 else "")


def _verdict(reference: RunRecords, other: RunRecords, killed_dir: str, say: Callable[[str], None]) -> int:
    restarts = len(other.attempts) - 1
    markers = os.path.join(killed_dir, "faults")  # one per fault that fired (see goodput.faults)
    fired = len(os.listdir(markers)) if os.path.isdir(markers) else 0
    after = f"after {restarts} restart{'' if restarts == 1 else 's'} ({fired} kill{'' if fired == 1 else 's'} fired)"
    idle = idle_generators(reference, other)
    if idle:
        it = "it" if len(idle) == 1 else "them"
        say(
            f"warning: the state of {' and '.join(idle)} differs between the two runs, but training never drew "
            f"from {it} (unseeded and unused): not compared"
        )
    differences = compare_records(reference, other)
    if not differences:
        say(
            "IDENTICAL: every step's samples, loss and random generators, and the final model, optimizer, "
            f"scheduler, RNG and data position match {after}"
        )
        return 0
    for difference in differences:
        say(f"DIFFERENT: {difference}")
    say("check:")
    for cause in differences[0].causes:  # later differences follow from the first
        say(f"  - {cause}")
    say(f"({after}; the workers' output is in {killed_dir}/{OUTPUT_LOG})")
    return 1
