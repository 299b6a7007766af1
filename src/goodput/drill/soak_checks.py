"""The soak's checks at the end, over what the run wrote already: the lineage's samples (``GOODPUT_RECORDS``),
the ledger's account, and the fault markers of :mod:`goodput.faults`.

No reference run: a soak is as long as the user asks, and a second run as long would double it. Exactly once is
checked inside the final lineage itself: every step from 1 to the last is there, on every rank, and no sample is
trained twice within an epoch (an epoch's length inferred from the samples the lineage met and the global
batch); a numeric window the guard skipped is named, not counted as lost.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from goodput.drill.soak_plan import KINDS, STORE, SoakFault
from goodput.verify.demo import trained_twice
from goodput.verify.records import RunRecords
from goodput.verify.rollback import undetectable_spikes
from goodput.verify.shrink import effective

__all__ = [
    "KindRow",
    "as_reference_at",
    "fired_faults",
    "first_skipped",
    "hung_attempts",
    "kind_rows",
    "lineage_problems",
    "skipped_windows",
    "tiling_problem",
    "until",
]

_NUMERIC_KINDS = {
    "nonfinite": "nan",
    "spike": "spike",
    "sdc": "bitflip",
}  # the guard's verdicts, as the soak's kinds


def lineage_problems(records: RunRecords, steps: int, *, skipped_steps: int = 0) -> list[str]:
    """Why the final lineage did not train every step's samples exactly once (empty: it did).

    ``skipped_steps``: how many steps of data the numeric guard skipped; an epoch holding them is that much
    shorter, so a sample met again that soon after an epoch's full length is its next epoch's, no repeat.
    """
    kept = effective(records).steps
    world = len(kept)
    by_step: dict[int, list[int]] = {}
    for rank_steps in kept.values():
        for step, record in rank_steps.items():
            if record.ids is None:
                return ["a step recorded no sample ids: iterate a ResumableLoader through run.batches"]
            by_step.setdefault(step, []).extend(record.ids)
    problems = []
    missing = [s for s in range(1, steps + 1) if s not in by_step]
    if missing:
        problems.append(f"{len(missing)} step(s) missing from the lineage, the first {missing[:5]}")
    # a step trained after a shrink or a grow has the world its ranks recorded
    worlds = {s: r.world or world for rank_steps in kept.values() for s, r in rank_steps.items()}
    short = [s for s in by_step if sum(1 for r in kept.values() if s in r) != worlds[s]]
    if short:
        problems.append(
            f"{len(short)} step(s) trained by fewer ranks than their world, the first {sorted(short)[:5]}"
        )
    twice = _repeats(dict(sorted(by_step.items())), skipped_steps)
    if twice:
        problems.append(f"{len(twice)} sample(s) trained twice within an epoch, the first {twice[:5]}")
    return problems


def _repeats(by_step: dict[int, list[int]], skipped_steps: int) -> list[int]:
    """The samples trained twice within one epoch; an epoch is as long as the samples met over the global
    batch (a loader that drops the last partial batch), less the skipped steps where they fell."""
    batch = max((len(ids) for ids in by_step.values()), default=0)
    if not batch:
        return []
    per_epoch = max(1, len({i for ids in by_step.values() for i in ids}) // batch)
    epochs, epoch, length = {}, 0, 0
    seen: set[int] = set()
    for step, ids in by_step.items():
        if length >= per_epoch or (seen.intersection(ids) and length >= per_epoch - skipped_steps):
            epoch, length, seen = epoch + 1, 0, set()
        epochs[step] = epoch
        length += 1
        seen.update(ids)
    return trained_twice(by_step, epochs)


def skipped_windows(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """The data windows the numeric guard skipped (a fault that came back), as ``steps A-B``."""
    return sorted({f"steps {e['first_step']}-{e['last_step']}" for e in events if e["event"] == "skip"})


def tiling_problem(categories: Mapping[str, float], wall_seconds: float) -> str:
    """Why the ledger's categories do not tile its wall time (empty: they do, within 1%)."""
    total = sum(categories.values())
    if abs(total - wall_seconds) > 0.01 * max(wall_seconds, 1.0):
        return f"the ledger's categories sum to {total:.1f}s, its wall time is {wall_seconds:.1f}s"
    return ""


def fired_faults(run_dir: str) -> dict[str, int]:
    """Kind -> how many of the plan's faults fired (their markers in the run folder; one per fault, however
    many ranks it fired on)."""
    folder = os.path.join(run_dir, "faults")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    faults = {name.rsplit("-rank", 1)[0] for name in names if "@" in name}
    counts: dict[str, int] = {}
    for fault in faults:
        kind = fault.split("@", 1)[0]
        counts[kind] = counts.get(kind, 0) + 1
    return counts


@dataclasses.dataclass(frozen=True, kw_only=True)
class KindRow:
    """One row of the per-kind table: the faults of one kind and what the ledger says they cost.

    Attributes:
        kind: one of the soak's kinds.
        scheduled: how many the schedule held.
        seen: how many the run shows: fired (their markers) for ``slow``; answered in the ledger (a restart, a
            rollback, a relaunch) for the others.
        detect: seconds from the fault to its declared failure, each (the ledger's ``failure_detection``).
        recover: seconds from the failure to training again, each (restart downtime, init and restore; a
            rollback's own measure; a relaunch's init and restore, the scheduler's wait left out).
        lost: seconds of work redone, each (the ledger's ``lost_work`` of the attempt the fault ended).
        undetectable: for ``spike``, the rises the spike rule needed (its own figure, as a factor of the loss's
            level) at each scheduled spike it missed where that figure was above half the spike's factor (the
            drill's spike scenario injects only below it): on that loss a spike of that factor can pass unseen
            (a step whose own loss lies under the level), so it goes unanswered without a violation; None for
            one that came while the rule warmed up after a relaunch (``NumericConfig.spike_warmup``).
        unreached: for the store's kinds, the windows the job's end closed before the store was asked
            anything (:mod:`goodput.drill.soak_store`): untested, no violation.
    """

    kind: str
    scheduled: int
    seen: int
    detect: tuple[float, ...] = ()
    recover: tuple[float, ...] = ()
    lost: tuple[float, ...] = ()
    undetectable: tuple[float | None, ...] = ()
    unreached: int = 0


def kind_rows(
    schedule: Sequence[SoakFault],
    attempts: Sequence[Any],
    events: Sequence[Mapping[str, Any]],
    fired: Mapping[str, int],
    relaunched: Sequence[str] = (),
    hung: Collection[int] = (),
    node_ranks: int = 0,
) -> list[KindRow]:
    """The per-kind table from the ledger's attempts (:class:`goodput.ledger.accounting.AttemptSummary`, in
    order), its ``rollback`` events, the fired markers and the kind of fault that ended each launch but the last
    (``relaunched``; a relaunch with none named counts as a preemption). A restart after an attempt in which a
    rank declared a hang (``hung``: those attempts' numbers) answered a ``hang``, any other a ``kill``. With
    ``node_ranks`` (a soak on two nodes of that many ranks) the table has a ``node`` row: a shrink that dropped
    a node's ranks answered a ``node``, one that dropped fewer a ``kill`` (its node's spare not ready in time);
    a grow is the way back, no fault. A restart after an attempt in which the guard handed a rank it named
    corrupt to a hot spare (``sdc_handover``) is part of that bit flip's answer, no fault of its own."""
    relaunches = list(relaunched)
    rollbacks = [e for e in events if e["event"] == "rollback"]
    # a bit flip's verdict that named the corrupt rank hands it to a hot spare once the rollback's attempt (the
    # next) has begun: the restart after that attempt is the flip's answer
    handed = {int(e["attempt"]) + 1 for e in events if e["event"] == "sdc_handover"}
    shrinks = [e for e in events if e["event"] == "shrink"]
    found: dict[str, list[tuple[float, float, float]]] = {}
    for previous, attempt in itertools.pairwise(attempts):
        before, after = previous.categories, attempt.categories
        detect, lost = before.get("failure_detection", 0.0), before.get("lost_work", 0.0)
        if attempt.began == "rollback" and rollbacks:
            event = rollbacks.pop(0)
            kind = _NUMERIC_KINDS.get(str(event.get("kind")), str(event.get("kind")))
            recover = float(event.get("seconds_total") or 0.0)
        elif attempt.began == "shrink" and node_ranks:
            failed = len(shrinks.pop(0).get("failed_ranks") or ()) if shrinks else 0
            kind = "node" if failed >= node_ranks else "kill"
            start = after.get("init", 0.0) + after.get("checkpoint_restore", 0.0)
            recover = start + before.get("restart_downtime", 0.0)
        elif attempt.began == "restart" and previous.number in handed:
            continue
        elif attempt.began == "restart":
            kind = "hang" if previous.number in hung else "kill"
            start = after.get("init", 0.0) + after.get("checkpoint_restore", 0.0)
            recover = start + before.get("restart_downtime", 0.0)
        elif attempt.began == "relaunch":
            kind = relaunches.pop(0) if relaunches else "preempt"
            recover = after.get("init", 0.0) + after.get("checkpoint_restore", 0.0)
        else:
            continue
        found.setdefault(kind, []).append((detect, recover, lost))
    rows = []
    for kind in (*KINDS, "node") if node_ranks else KINDS:
        if kind in STORE:  # the store's rows: goodput.drill.soak_store
            continue
        scheduled = sum(1 for f in schedule if f.kind == kind)
        seen = found.get(kind, [])
        count = fired.get(kind, 0) if kind == "slow" else len(seen)
        rows.append(
            KindRow(
                kind=kind,
                scheduled=scheduled,
                seen=count,
                detect=tuple(d for d, _, _ in seen),
                recover=tuple(r for _, r, _ in seen),
                lost=tuple(w for _, _, w in seen),
                undetectable=tuple(undetectable_spikes(events).values()) if kind == "spike" else (),
            )
        )
    return rows


def hung_attempts(events: Iterable[Mapping[str, Any]]) -> set[int]:
    """The attempts in which a rank declared a hang (its peers may have declared the failure it caused)."""
    return {
        int(e["attempt"])
        for e in events
        if e["event"] == "failure_detected" and str(e.get("reason", "")).startswith("hang")
    }


def first_skipped(events: Iterable[Mapping[str, Any]]) -> int | None:
    """The first step of the first data window the numeric guard skipped (None: it skipped none)."""
    return min((int(e["first_step"]) for e in events if e["event"] == "skip"), default=None)


def until(records: RunRecords, step: int | None) -> RunRecords:
    """``records`` before ``step`` (None: all of them), without the final state: from a skipped window on, the
    data order differs from an uninterrupted run's by design (each later epoch is that much shorter)."""
    if step is None:
        return records
    kept = {rank: {s: r for s, r in by_step.items() if s < step} for rank, by_step in records.steps.items()}
    return dataclasses.replace(records, steps=kept, final={})


def as_reference_at(records: RunRecords, reference: RunRecords, steps: Collection[int]) -> RunRecords:
    """``records`` with the loss of each of ``steps`` taken from ``reference``: a spike the rule could not see is
    the loss the script reported, not what it trained on (the spike fault scales the reported loss, not the
    gradients), so at its step only the loss differs."""
    if not steps:
        return records
    patched = {
        rank: {
            step: dataclasses.replace(r, loss=reference.steps[rank][step].loss)
            if step in steps and step in reference.steps.get(rank, {})
            else r
            for step, r in by_step.items()
        }
        for rank, by_step in records.steps.items()
    }
    return dataclasses.replace(records, steps=patched)
