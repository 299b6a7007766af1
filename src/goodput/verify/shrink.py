"""``goodput verify-resume --restart warm --spares 0 --shrink-after S -- train.py``: a world-size-aware verdict.

A job that shrinks in place and grows back trains some steps on fewer ranks, each with a larger share of the
same global batch, so it cannot be bit for bit equal to a run on a fixed number of ranks: the per-rank batches,
and with them the reduction order of the gradients, differ. Four runs answer what can be answered:

1. uninterrupted, on ``--nproc`` ranks: its steps and saves place the kills; its global batches are the truth;
2. interrupted, under the warm agent with no spare: kills shrink the group, replacements grow it back;
3. its world-size schedule (each step's world, from the records' attempt headers) is read back, and
4. a reference follows that schedule with no failure: one cold launch per part, on that part's number of
   ranks, each resuming the previous part's final checkpoint (``GOODPUT_STOP_AFTER`` ends a part at its step).

The verdict: every step trained the same global batch as the uninterrupted run, each sample exactly once (from
the sample ids ``Run`` records), and every rank's steps (samples, loss, random draws) and final state, its random
generators included, equal the reference's: after a shrink or a grow each rank's generators hold what a cold
resume on the new world gives that rank (``goodput.warm.streams``), which is what the reference does.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence

from goodput._env import STOP_AFTER, WARM_MIN_WORLD
from goodput.errors import ConfigError
from goodput.launch.launcher import launch_job
from goodput.run.records import FINAL_FILE, RECORDS_DIR
from goodput.verify.compare import compare_records
from goodput.verify.records import RunRecords
from goodput.verify.script import (
    empty_folders,
    environment,
    kill_plan,
    launch_config,
    records_of,
    run_captured,
    saved_steps,
)

__all__ = ["effective", "exactly_once", "verify_shrink", "world_schedule"]

Say = Callable[[str], None]


def effective(records: RunRecords) -> RunRecords:
    """The records of the last time each step was trained: for each step, only the ranks of the highest attempt
    that recorded it (a rank that trained a step before a failure, which the survivors then trained again on
    fewer ranks, no longer counts)."""
    latest: dict[int, int] = {}
    for steps in records.steps.values():
        for step, record in steps.items():
            latest[step] = max(latest.get(step, record.attempt), record.attempt)
    kept = {
        rank: {step: r for step, r in steps.items() if r.attempt == latest[step]}
        for rank, steps in records.steps.items()
    }
    return dataclasses.replace(records, steps={rank: steps for rank, steps in kept.items() if steps})


def world_schedule(records: RunRecords) -> list[tuple[int, int]]:
    """``[(first_step, world), ...]``: the world size each run of steps trained on (effective records).

    Raises:
        ConfigError: records without world sizes (written by an older goodput).
    """
    worlds: dict[int, int] = {}
    for steps in effective(records).steps.values():
        for step, record in steps.items():
            if record.world is None:
                raise ConfigError("the records carry no world size: rerun with this goodput")
            worlds[step] = record.world
    out: list[tuple[int, int]] = []
    for step in sorted(worlds):
        if not out or out[-1][1] != worlds[step]:
            out.append((step, worlds[step]))
    return out


def exactly_once(reference: RunRecords, other: RunRecords) -> str | None:
    """None when every step of ``other`` trained, over all its ranks, the same samples as the same step of
    ``reference`` (a fixed-world run no failure interrupted); else a sentence naming the first step that did not.

    The uninterrupted run trains each sample once an epoch, so a run whose every step matches it skips none and
    repeats none; a sample met again in a later epoch is no repeat.
    """
    ref, got = _samples_by_step(effective(reference)), _samples_by_step(effective(other))
    if None in ref.values() or None in got.values():
        return "a step recorded no sample ids: iterate a ResumableLoader through run.batches"
    for step in sorted(set(ref) | set(got)):
        mine, theirs = got.get(step), ref.get(step)
        if mine is None or theirs is None or sorted(mine) != sorted(theirs):
            return f"step {step} trained samples {_short(mine)} where the uninterrupted run trained {_short(theirs)}"
    return None


def _samples_by_step(records: RunRecords) -> dict[int, list[int] | None]:
    """Each step's sample ids over all its ranks (None: a rank recorded none)."""
    out: dict[int, list[int] | None] = {}
    for steps in records.steps.values():
        for step, record in steps.items():
            so_far = out.get(step, [])
            out[step] = None if so_far is None or record.ids is None else [*so_far, *record.ids]
    return out


def _short(ids: list[int] | None) -> str:
    if ids is None:
        return "none"
    ids = sorted(ids)
    return str(ids if len(ids) <= 8 else [*ids[:8], "..."])


def verify_shrink(
    script: Sequence[str],
    *,
    nproc: int,
    kills: int,
    seed: int,
    work_dir: str | None,
    shrink_after: float,
    min_world: int = 1,
    say: Say = print,
) -> int:
    """The four runs of the module docstring; 0 when the verdict holds, 1 with the first difference.

    Raises:
        ConfigError: a flag out of range, or a script that does not record through ``Run``.
    """
    if nproc < 2 or not 1 <= min_world < nproc:
        raise ConfigError(
            f"shrinking needs --nproc >= 2 and --min-world below it, got {nproc} and {min_world}"
        )
    work, dirs = empty_folders(work_dir, ("uninterrupted", "interrupted", "reference"))
    say(f"goodput verify-resume: {' '.join(script)}, {nproc} ranks, warm restarts with no spare "
        f"(shrink after {shrink_after:g} s, down to {min_world}), in {work}")  # fmt: skip
    # The uninterrupted run sees --min-world as the interrupted one will, so that a script whose loader cannot
    # keep its global batch on fewer ranks is refused in seconds, before anything trains.
    with environment(WARM_MIN_WORLD.name, str(min_world)):
        if not run_captured(lambda: launch_job(launch_config(script, nproc, dirs["uninterrupted"])),
                            dirs["uninterrupted"], "uninterrupted", say):  # fmt: skip
            return 1
    clean = records_of(dirs["uninterrupted"], script)
    steps = max(max(s, default=0) for s in clean.steps.values())
    saves, async_saves = saved_steps(dirs["uninterrupted"])
    plan = kill_plan(
        kills, steps=steps, saves=saves, nproc=nproc, seed=seed, async_saves=async_saves, inside_steps=True
    )
    say(f"uninterrupted: {steps} steps; faults: {plan or 'none'}")

    def interrupted() -> int:
        from goodput.warm.agent import WarmConfig, launch_warm

        config = launch_config(script, nproc, dirs["interrupted"], faults=plan, restarts=2 * kills + 2)
        return launch_warm(config, WarmConfig(spares=0, shrink_after=shrink_after, min_world=min_world))

    if not run_captured(interrupted, dirs["interrupted"], "interrupted", say):
        return 1
    killed = records_of(dirs["interrupted"], script)
    schedule = world_schedule(killed)
    ended = {int(f.get("world") or 0) for f in killed.final.values()}
    if len(ended) == 1 and 0 not in ended and ended != {schedule[-1][1]}:
        # a failure after the last step (in the final save): the run closed on another world, so does the reference
        schedule.append((steps + 1, ended.pop()))
    say("world sizes: " + ", ".join(f"{w} from step {s}" for s, w in schedule))
    if not _reference(script, schedule, steps, dirs["reference"], say):
        return 1
    return _verdict(clean, killed, records_of(dirs["reference"], script), dirs["interrupted"], say)


def _cold(script: Sequence[str], world: int, run_dir: str) -> int:
    """One part of the reference: a cold launch of ``script`` on ``world`` ranks, resuming ``run_dir``."""
    return launch_job(launch_config(script, world, run_dir))


def _reference(
    script: Sequence[str], schedule: list[tuple[int, int]], steps: int, run_dir: str, say: Say
) -> bool:
    """One cold launch per part of ``schedule``, each stopped after its last step (but the last)."""
    ends = [first - 1 for first, _ in schedule[1:]] + [steps]
    for n, ((_, world), end) in enumerate(zip(schedule, ends, strict=True)):
        last = n == len(schedule) - 1
        with environment(STOP_AFTER.name, "" if last else str(end)):
            ok = run_captured(functools.partial(_cold, script, world, run_dir), run_dir, "reference", say)
        if not ok:
            return False
        if not last:  # only the last part's ranks end the run: drop the earlier parts' final states
            folder = os.path.join(run_dir, RECORDS_DIR)
            for name in os.listdir(folder):
                if FINAL_FILE.match(name):
                    os.remove(os.path.join(folder, name))
    return True


def _verdict(clean: RunRecords, killed: RunRecords, reference: RunRecords, killed_dir: str, say: Say) -> int:
    """0 when the interrupted run trained the uninterrupted run's global batches and matches the reference; else
    1, having said each difference."""
    once = exactly_once(clean, killed)
    if once is not None:
        say(f"DIFFERENT: {once}")
        return 1
    differences = compare_records(effective(reference), effective(killed))
    if not differences:
        say(
            "IDENTICAL: every step trained the uninterrupted run's global batch, each sample exactly once; every "
            "rank's samples, loss and random draws at every step, and the final model, optimizer, scheduler, RNG "
            "and data position, match a reference that trained on the same world sizes with no failure"
        )
        return 0
    for difference in differences:
        say(f"DIFFERENT (against the same world sizes with no failure): {difference}")
    say(f"(the workers' output is in {killed_dir}/output.log)")
    return 1
