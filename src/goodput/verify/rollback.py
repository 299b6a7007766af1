"""``goodput verify-rollback [-- train.py]``: the numeric guard's ladder, checked bit for bit.

Three runs of the same training under ``goodput launch``, the numeric guard on in each (``GOODPUT_NUMERIC=1``
turns it on at its defaults in a script that leaves it off):

1. **clean**: no fault. Its length places the drill, and it must raise no alarm (a false alarm would roll back).
2. **faulted**: the drill of :func:`drill_plan`: a NaN loss that comes back on its redo (rolled back, then rolled
   back again and its data window skipped), a loss spike (rolled back), a flipped bit on rank 0 (found at a
   replica check, rolled back).
3. **skipping**: no fault, the faulted run's skip list given from the start (its run folder begins with the
   faulted run's ``numeric/skips.json``, which the guard applies at every restore).

The faulted run must end as the skipping one, compared as verify-resume compares (``GOODPUT_RECORDS=1``: each
step's samples, loss and random generators as last trained, and the final state): the rollbacks left no trace,
the skipped samples were never trained, and every other sample was trained once, as in a run that never saw
them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from goodput._env import NUMERIC
from goodput.errors import ConfigError
from goodput.launch.launcher import LaunchConfig, launch_job
from goodput.verify.compare import compare_records
from goodput.verify.script import OUTPUT_LOG, records_of, run_captured

__all__ = [
    "WARMING_UP",
    "drill_plan",
    "drill_problems",
    "hidden_spike",
    "rise_before",
    "spike_needs",
    "spike_step",
    "undetectable_spikes",
    "verify_rollback",
]


_SPIKE = 20  # the drill's spike factor: injected where the rule catches a rise of half of it
# ``spike_missed``'s reason while the rule warms up: goodput.run.numeric.spikes.WARMING_UP (which imports torch)
WARMING_UP = "the spike rule was warming up"


def spike_step(steps: int) -> int:
    """The step of the drill's spike in a run of ``steps`` steps (55% of them)."""
    return max(2, 11 * steps // 20)


def rise_before(figures: Sequence[Mapping[str, Any]], step: int) -> tuple[int, float] | None:
    """The spike rule's own figure for a spike at ``step``, from a run's ``spike_rule`` events: (the event's
    step, the smallest rise it catches) of the newest before ``step``, else of the first (the figure at the end
    of its warm-up). None without one, or where the rule measures no factor (a loss that is not positive)."""
    before = [e for e in figures if int(e["step"]) < step] or list(figures[:1])
    if not before or before[-1].get("rise") is None:
        return None
    return int(before[-1]["step"]), float(before[-1]["rise"])


def spike_needs(steps: int, figures: Sequence[Mapping[str, Any]]) -> float | None:
    """The rise the spike rule needs at the drill's spike step (:func:`rise_before` of the clean run's
    ``spike_rule`` events) when a ``_SPIKE``x spike would pass unseen there (a factor under twice the rise);
    None when the spike is detectable or no figure says otherwise."""
    found = rise_before(figures, spike_step(steps))
    return found[1] if found is not None and 2 * found[1] > _SPIKE else None


def undetectable_spikes(events: Sequence[Mapping[str, Any]]) -> dict[int, float | None]:
    """Step -> the rise the spike rule needed there, at each missed spike (the ledger's ``spike_missed``, once
    per step) that the rule could not see: the loss it judged there (``loss``) at or below its ``threshold``
    (a spike of a step whose own loss was well under the loss's level), or, in a ledger without ``loss``, a
    factor below twice the rise; None at one that came while the rule warmed up (after a relaunch, whose
    processes start without its window: a soak places no spike in the job's first warm-up). A missed spike
    whose loss was above the threshold is the guard's fault, never excused."""
    needed: dict[int, float | None] = {}
    for e in events:
        if e["event"] != "spike_missed":
            continue
        if e.get("loss") is not None and e.get("threshold") is not None:
            if float(e["loss"]) <= float(e["threshold"]):
                needed[int(e["step"])] = None if e.get("rise") is None else float(e["rise"])
        elif e.get("rise") is not None and 2 * float(e["rise"]) > float(e["factor"]):
            needed[int(e["step"])] = float(e["rise"])
        elif str(e.get("why", "")).startswith(WARMING_UP):
            needed[int(e["step"])] = None
    return dict(sorted(needed.items()))


def hidden_spike(missed: Sequence[Mapping[str, Any]]) -> str:
    """Why a run's missed spikes were not detectable ("" where one was: the guard saw a loss over its threshold
    and let it pass, or where none was missed): a placement reads a run's figure before the spike, but the
    spiked step's own loss may sit so far under the loss's level that the spike stays at or below the rule's
    threshold (its ``spike_missed`` says the loss the rule judged, beside the threshold)."""
    if not missed or len(undetectable_spikes(missed)) < len({int(e["step"]) for e in missed}):
        return ""
    return f"not detectable on this loss: {missed[0]['why']}"


def drill_plan(
    steps: int, nproc: int, *, check_every: int | None = 50, window: int = 1000, spike: bool = True
) -> str:
    """The numeric drill for a run of ``steps`` steps: a NaN loss on the last rank at 30% of the steps, twice
    (it comes back on the redo, as a NaN in the data does: two rollbacks and a skip), a 20x loss spike at 55%,
    and, with replicas to compare, a flipped bit in rank 0's parameters at a replica check step (every
    ``check_every``): the first from 80% on, else the last one, and only from the second check on (a corrupted
    replica rolls back to the last check that agreed, and before the first there is none). ``spike`` False
    leaves the spike out (the loss hides it: :func:`spike_needs`); ``check_every`` None, the flipped bit.

    The guard stops after 3 rollbacks within ``window`` steps (its defaults): when the four rollbacks would
    fall within one window (a run under 2,000 steps), the spike is left out where the flipped bit fits, else
    the flipped bit.
    """
    nan = f"nan@step={max(1, 3 * steps // 10)},rank={nproc - 1}"
    every = check_every or steps + 1
    check = -(-(4 * steps // 5) // every) * every
    if check >= steps:
        check = (steps - 1) // every * every
    flip = [f"bitflip@step={check},rank=0"] if nproc > 1 and check >= 2 * every else []
    spikes = [f"spike@step={spike_step(steps)},factor={_SPIKE}"] if spike else []
    if flip and check - max(1, 3 * steps // 10) < window:
        spikes = []
    return "; ".join([nan, nan, *spikes, *flip])


def verify_rollback(
    script: Sequence[str], *, nproc: int, work_dir: str | None, say: Callable[[str], None] = print
) -> int:
    """Run ``script`` clean, with the numeric drill, and skipping the drill's data from the start; 0 when the
    last two end identical and every fault was found, 1 otherwise.

    Raises:
        ConfigError: the script is missing, or it records no step (it does not use ``Run``).
    """
    if not script or (script[0].endswith(".py") and not os.path.isfile(script[0])):
        raise ConfigError(f"the training script {script[0] if script else ''!r} does not exist")
    if nproc < 1:
        raise ConfigError(f"need --nproc >= 1, got {nproc}")
    work = work_dir or tempfile.mkdtemp(prefix="goodput-verify-rollback-")
    dirs = {name: os.path.join(work, name) for name in ("clean", "faulted", "skipping")}
    for folder in dirs.values():
        if os.path.exists(folder):
            raise ConfigError(f"{folder} already exists (an earlier verify?): choose an empty --work-dir")
    say(f"goodput verify-rollback: {' '.join(script)}, {nproc} ranks, in {work}")

    def launch(run_dir: str, faults: str) -> Callable[[], int]:
        config = LaunchConfig(
            script=tuple(script), nproc=nproc, max_restarts=0, run_dir=run_dir, faults=faults,
            rdzv_id="goodput-verify", verbose=True,
        )  # fmt: skip
        return lambda: launch_job(config)

    with _numeric_on():
        if not run_captured(launch(dirs["clean"], ""), dirs["clean"], "clean", say):
            return 1
        clean = records_of(dirs["clean"], script)
        steps = max(max(s, default=0) for s in clean.steps.values())
        alarms = _events(dirs["clean"], "numeric_fault")
        plan = _plan(dirs["clean"], steps, nproc, say)
        say(f"clean: {steps} steps, {len(alarms)} alarm{'' if len(alarms) == 1 else 's'}; drill: {plan}")
        if not run_captured(launch(dirs["faulted"], plan), dirs["faulted"], "faulted", say):
            return 1
        _seed_skips(dirs["faulted"], dirs["skipping"])
        if not run_captured(launch(dirs["skipping"], ""), dirs["skipping"], "skipping", say):
            return 1
    from goodput.ledger import read_events

    events = read_events(dirs["faulted"], rank=0)
    for line in _ladder(events):
        say(line)
    problems, hidden = drill_problems(plan, events)
    if hidden:
        say(f"spike: {hidden}: not counted against the guard")
    problems += [f"the clean run raised {len(alarms)} false alarm(s)"] * bool(alarms)
    differences = compare_records(records_of(dirs["skipping"], script), records_of(dirs["faulted"], script))
    problems += [str(d) for d in differences[:3]]
    if not problems:
        say(
            "IDENTICAL: with the drill's faults rolled back and its data skipped, every step's samples, loss and "
            "random generators, and the final model, optimizer, scheduler, RNG and data position match a run "
            "that skipped the same samples from the start: each other sample was trained once"
        )
        return 0
    for problem in problems:
        say(f"DIFFERENT: {problem}")
    say(f"(the workers' output is in {dirs['faulted']}/{OUTPUT_LOG} and {dirs['skipping']}/{OUTPUT_LOG})")
    return 1


def drill_problems(plan: str, events: Sequence[Mapping[str, Any]]) -> tuple[list[str], str]:
    """What the faulted run of ``plan`` did not do, from its ledger ``events``: a drill fault not found (a missed
    spike with the guard's reason), the NaN that came back not skipped; and why a spike it missed was not
    detectable ("" where none was: see :func:`hidden_spike`; such a spike is not counted as not found)."""
    found = {e["kind"] for e in events if e["event"] == "numeric_fault"}
    wanted = {"nonfinite", *(["spike"] if "spike" in plan else []), *(["sdc"] if "bitflip" in plan else [])}
    missed = [e for e in events if e["event"] == "spike_missed"]
    hidden = hidden_spike(missed) if "spike" in wanted - found else ""
    if hidden:
        wanted.discard("spike")
    why = {"spike": f": {missed[0]['why']}" if missed else ""}
    problems = [f"the drill's {kind} was not found{why.get(kind, '')}" for kind in sorted(wanted - found)]
    if not any(e["event"] == "skip" for e in events):
        problems.append("the NaN that came back was not skipped")
    return problems, hidden


def _plan(clean: str, steps: int, nproc: int, say: Callable[[str], None]) -> str:
    """The drill for the clean run's guard, placed by its own figures: its ``check_every``, and the smallest rise
    its spike rule catches (a spike the loss hides is left out, and said)."""
    configs = _events(clean, "numeric_config")
    check_every = configs[0].get("check_every") if configs else 50
    needs = spike_needs(steps, _events(clean, "spike_rule"))
    if needs is not None:
        say(
            f"spike: not detectable on this loss: needs a rise of {needs:.1f}x (the spike rule's figure in the clean "
            f"run before step {spike_step(steps)}; a {_SPIKE}x spike would pass unseen): the drill injects none"
        )
    return drill_plan(steps, nproc, check_every=check_every, spike=needs is None)


class _numeric_on:
    """``GOODPUT_NUMERIC=1`` meanwhile: ``Run`` turns the guard on at its defaults where the script left it off."""

    def __enter__(self) -> None:
        self._before = os.environ.get(NUMERIC.name)
        os.environ[NUMERIC.name] = "1"

    def __exit__(self, *exc: object) -> None:
        if self._before is None:
            os.environ.pop(NUMERIC.name, None)
        else:
            os.environ[NUMERIC.name] = self._before


def _seed_skips(faulted: str, skipping: str) -> None:
    """The skipping run starts with the faulted run's skip list (``numeric/skips.json``)."""
    from goodput.run.numeric import SKIPS_FILE

    source = os.path.join(faulted, SKIPS_FILE)
    if os.path.exists(source):
        os.makedirs(os.path.dirname(os.path.join(skipping, SKIPS_FILE)), exist_ok=True)
        shutil.copyfile(source, os.path.join(skipping, SKIPS_FILE))


def _events(run_dir: str, name: str) -> list[dict[str, Any]]:
    from goodput.ledger import read_events

    return [e for e in read_events(run_dir, rank=0) if e["event"] == name]


def _ladder(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per rung the faulted run took, from its ledger ``events``."""
    lines = []
    for e in events:
        if e["event"] == "numeric_fault":
            lines.append(f"found {e['kind']} ({e.get('detail', '')}) at step {e['step']}")
        elif e["event"] == "rollback":
            lines.append(f"rolled back from step {e['from_step']} to {e['to_step']} ({e['tier']} tier)")
        elif e["event"] == "skip":
            lines.append(f"skipped steps {e['first_step']}-{e['last_step']}: {e['samples']} samples")
    return lines
