"""The soak's verdict and tables: the checks of :mod:`goodput.drill.soak_checks` run on the finished job, what
the sampler read (:mod:`goodput.drill.soak_leaks`), and nothing of the job left behind."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from goodput.drill.drill import aligned
from goodput.drill.runs import largest_losses, outcome_text
from goodput.drill.soak_cache import CacheSample
from goodput.drill.soak_checks import (
    KindRow,
    as_reference_at,
    fired_faults,
    first_skipped,
    hung_attempts,
    kind_rows,
    lineage_problems,
    skipped_windows,
    tiling_problem,
    until,
)
from goodput.drill.soak_leaks import peaks
from goodput.drill.soak_plan import SoakPlan
from goodput.drill.soak_store import StoreWindow, store_problems, store_rows
from goodput.drill.supervisors import left_after, ram_folders
from goodput.verify.rollback import undetectable_spikes

if TYPE_CHECKING:
    from goodput.drill.soak_leaks import Sampler
    from goodput.verify.records import RunRecords

__all__ = ["Outcome", "cache_text", "judge_run", "print_tables"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """A finished soak: how the job ended, the tables' rows and every violation found (empty: all held)."""

    status: int
    seconds: float
    kinds: tuple[KindRow, ...]
    processes: tuple[tuple[str, ...], ...]
    node: str
    account: str
    skipped: tuple[str, ...]
    violations: tuple[str, ...]
    result: str = ""
    first_skip: int | None = None  # the first step of the guard's first skipped data window


def judge_run(
    plan: SoakPlan, run_dir: str, *, status: int, seconds: float, sampler: Sampler, stopped: str,
    relaunched: Sequence[str] = (), reference: RunRecords | None = None, store: Sequence[StoreWindow] = (),
    node_ranks: int = 0,
) -> Outcome:  # fmt: skip
    """Every check of the soak on the finished job in ``run_dir`` (``stopped``: the violation that stopped it
    early, whose job's account is still given, its lineage left unjudged; ``relaunched``: the kind of fault that
    ended each launch but the last; ``reference``: the same command's uninterrupted run, whose records the final
    lineage must equal, step by step and in its final state; ``store``: the store faults' windows; ``node_ranks``:
    the ranks of each node of a soak on two nodes, whose table has a ``node`` row)."""
    from goodput.ledger import read_events
    from goodput.ledger.accounting import account
    from goodput.verify.records import read_records

    found = [stopped] if stopped else []
    if status != 0 and not stopped:
        found.append(f"the job {outcome_text(status)}, expected completed (its output: {run_dir}/output.log)")
    if left := left_after(run_dir):
        found.append(f"{len(left)} process(es) of the job outlived it: {left}")
    if folders := ram_folders(run_dir):
        found.append(f"RAM or temporary folders left behind: {', '.join(folders)}")
    try:
        events, first_rank = read_events(run_dir, rank=None), read_events(run_dir, rank=0)
        acc = account(events)
    except (FileNotFoundError, ValueError):
        return _outcome(status, seconds, (), sampler, "no ledger", (), [*found, "the job wrote no ledger"])
    if problem := tiling_problem(acc.categories, acc.wall_seconds):
        found.append(problem)
    kinds = tuple(
        kind_rows(
            plan.schedule,
            acc.attempts,
            first_rank,
            fired_faults(run_dir),
            relaunched,
            hung_attempts(events),
            node_ranks,
        )
    ) + tuple(store_rows(plan.schedule, store, events))
    result = "the final state: not compared with an uninterrupted run (a replay, or the built-in script without --reference)"
    cut = first_skipped(first_rank)
    if not stopped:
        try:
            skipped = sum(
                int(e["last_step"]) - int(e["first_step"]) + 1 for e in first_rank if e["event"] == "skip"
            )
            records = read_records(run_dir)
            found += lineage_problems(records, plan.steps, skipped_steps=skipped)
            if reference is not None:
                patched = as_reference_at(records, reference, undetectable_spikes(first_rank))
                result, identical = compared_until(_against, reference, patched, cut)
                found += [] if identical else [result]
        except FileNotFoundError:
            found.append("the job recorded no step")
        found += _count_problems(kinds) + store_problems(store, events)
    biggest = largest_losses(acc.categories, 4)
    text = (
        f"ledger: wall {acc.wall_seconds:.1f}s in {acc.launches} launch(es), {len(acc.attempts)} attempts, "
        f"categories {'tile it' if not tiling_problem(acc.categories, acc.wall_seconds) else 'DO NOT tile it'}; "
        f"goodput {acc.goodput:.1%} ({_predicted(run_dir)}); lost: {biggest or 'nothing'}"
    )
    outcome = _outcome(status, seconds, kinds, sampler, text, tuple(skipped_windows(first_rank)), found)
    return dataclasses.replace(outcome, result=result, first_skip=cut)


def compared_until(
    compare: Callable[[RunRecords, RunRecords], tuple[str, bool]],
    reference: RunRecords,
    records: RunRecords,
    cut: int | None,
) -> tuple[str, bool]:
    """``compare`` (a line, and whether the lineages agree) of both lineages before ``cut``, the first step of
    the guard's first skipped window (None: whole), its line saying where the comparison stopped and why."""
    line, same = compare(until(reference, cut), until(records, cut))
    if cut is not None:
        line += (
            f" (compared up to step {cut - 1}: the guard skipped the data of step {cut} on, so the data order "
            "differs from there by design)"
        )
    return line, same


def _against(reference: RunRecords, records: RunRecords) -> tuple[str, bool]:
    """The final lineage against the uninterrupted run's records, in one line, and whether they are identical."""
    from goodput.verify.compare import compare_records

    differences = compare_records(reference, records)
    if differences:
        return f"the final lineage differs from the uninterrupted run's: {differences[0]}", False
    steps = max((max(s, default=0) for s in records.steps.values()), default=0)
    return (
        f"the final state: identical to the uninterrupted run's (every step's samples, loss and generators, "
        f"{steps} steps)",
        True,
    )


def _predicted(run_dir: str) -> str:
    """The planner's goodput fed this run's own measured figures (``goodput report``'s prediction)."""
    from goodput.ledger.report import load_report

    predicted = load_report(run_dir).prediction.predicted_goodput
    return (
        "no prediction"
        if predicted is None
        else f"the planner's prediction from its own figures {predicted:.1%}"
    )


def _count_problems(kinds: Sequence[KindRow]) -> list[str]:
    """Each kind seen less often than scheduled (a fault that went unanswered; a spike the rule's own figure
    called undetectable on this loss excepted), or more (a failure nobody injected); more numeric rollbacks than
    injected are the guard's own findings on the loss, not counted."""
    return [
        f"{r.kind}: {r.scheduled} scheduled, {r.seen} seen"
        + (f" ({len(r.undetectable)} not detectable)" if r.undetectable else "")
        for r in kinds
        if r.seen + len(r.undetectable) + r.unreached < r.scheduled
        or (r.seen > r.scheduled and r.kind not in ("nan", "spike"))
    ]


def _outcome(
    status: int, seconds: float, kinds: tuple[KindRow, ...], sampler: Sampler, account: str,
    skipped: tuple[str, ...], found: Sequence[str],
) -> Outcome:  # fmt: skip
    return Outcome(
        status=status, seconds=seconds, kinds=kinds, processes=_process_rows(sampler), node=_node_line(sampler),
        account=account, skipped=skipped, violations=tuple(found),
    )  # fmt: skip


def _process_rows(sampler: Sampler) -> tuple[tuple[str, ...], ...]:
    """One row per role of process: how many, and each figure's first and highest reading over them."""
    roles: dict[str, list[dict[str, float]]] = {}
    for series in sampler.series.values():
        roles.setdefault(series[0].role, []).append(peaks(series))
    rows = []
    for role, found in sorted(roles.items()):
        cells = [role, str(len(found))]
        for metric in ("rss_mib", "fds", "threads", "children"):
            first, top = min(p[f"{metric}_first"] for p in found), max(p[f"{metric}_max"] for p in found)
            cells.append(f"{first:.0f} -> {top:.0f}")
        rows.append(tuple(cells))
    return tuple(rows)


def _node_line(sampler: Sampler) -> str:
    if not sampler.node:
        return "node: not sampled"
    shm, run, temp = ([n[i] for n in sampler.node] for i in (1, 2, 3))
    return (
        f"node: /dev/shm entries {shm[0]} -> max {max(shm)} -> {shm[-1]} at the end; run folder "
        f"{run[0]:.1f} -> max {max(run):.1f} MiB; temporary folder entries {temp[0]} -> {temp[-1]}; "
        f"{cache_text(sampler.cache)} ({len(sampler.node)} samples)"
    )


def cache_text(readings: Sequence[CacheSample]) -> str:
    """The bytes each data cache held (first -> max -> last) against its budget, or that the job declared none."""
    if not readings:
        return "data cache: none declared in the job's ledger, not checked"
    folders: dict[str, list[CacheSample]] = {}
    for reading in readings:
        folders.setdefault(reading.folder, []).append(reading)
    return "; ".join(
        f"data cache {folder}: {_mib(held[0].held)} -> max {_mib(max(r.held for r in held))} -> "
        f"{_mib(held[-1].held)} MiB of its {_mib(held[-1].budget)} MiB budget"
        for folder, held in folders.items()
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def _seconds(values: tuple[float, ...], total: bool = False) -> str:
    if not values:
        return "-"
    first = sum(values) if total else sum(values) / len(values)
    return f"{first:.1f} / {max(values):.1f}"


def print_tables(outcome: Outcome, plan: SoakPlan) -> None:
    """The soak's account on stdout: the per-kind table, the processes' table, the node, the ledger."""
    header = (
        "fault",
        "scheduled",
        "seen",
        "detect s mean/max",
        "recover s mean/max",
        "work lost s total/max",
    )
    rows: list[tuple[str, ...]] = [
        (
            r.kind,
            str(r.scheduled),
            str(r.seen),
            _seconds(r.detect),
            _seconds(r.recover),
            _seconds(r.lost, total=True),
        )
        for r in outcome.kinds
    ]
    print(aligned(header, rows))
    print()
    print(
        aligned(("process", "count", "RSS MiB", "open files", "threads", "children"), list(outcome.processes))
    )
    print(outcome.node)
    print(outcome.account)
    print(f"skipped numeric windows: {', '.join(outcome.skipped) or 'none'}")
    print(outcome.result)
    extra = [
        f"{r.seen - r.scheduled} {r.kind}"
        for r in outcome.kinds
        if r.kind in ("nan", "spike") and r.seen > r.scheduled
    ]
    if extra:
        print(
            f"numeric rollbacks nobody injected (the guard's own findings on this loss): {', '.join(extra)}"
        )
    for r in outcome.kinds:
        rises = [x for x in r.undetectable if x is not None]
        if rises:
            needs = ", ".join(f"{x:.0f}x" for x in rises)
            print(
                f"spikes not detectable on this loss: {len(rises)} (the spiked loss stayed at or below the spike "
                f"rule's threshold; its own figure at their steps needed a rise of {needs} over the loss's "
                "level; docs/drill.md)"
            )
        if warming := len(r.undetectable) - len(rises):
            print(
                f"spikes not detectable while the rule warmed up after a relaunch: {warming} (NumericConfig"
                "(spike_warmup=); docs/numeric-faults.md)"
            )
    for r in outcome.kinds:
        if r.unreached:
            print(
                f"{r.kind}: {r.unreached} window(s) closed by the job's end before the store was asked anything "
                f"(not tested)"
            )
    verdict = "every check held" if not outcome.violations else f"{len(outcome.violations)} violation(s)"
    print(f"soak: {plan.steps} steps, {outcome.seconds:.0f}s, {outcome_text(outcome.status)}: {verdict}")
