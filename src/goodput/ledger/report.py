"""The run report: where the time went, measured against the planner, and what to change.

:func:`build_report` is pure (events in, report out); :func:`load_report` reads a run folder. The planner
(:mod:`goodput.planning`, Daly's exact model) is run with the *measured* checkpoint stall C, persist time W, restart
time R, detection time D and the observed MTBF M, at the measured checkpoint interval and at its optimum. The
planner models checkpoints and failures only. Its interval is the measured wall time between saves (less the time of
a failure between them, which it charges per failure), which holds what it does not model (data_wait, warmup,
straggler_wait, other) as if it were training, and its time starts after the first attempt's init. So the comparable
``predicted_goodput`` is the planner's goodput times ``modelled_share`` (the share of job time, wall time minus
between_launches, past the first init), less ``unmodelled_share`` (those categories' share of job time): exact for a
run without failures.

A run that answered failures by shrinking in place (``shrink`` events: no spare was left) is predicted with
:func:`goodput.planning.goodput_shrink` on top: its measured shrink and grow costs, detection, lost step and
the time it trained short of a rank give the time goodput and the capacity goodput; the checkpoint model then
counts only the failures that were restarts. Without shrinks the predicted capacity goodput is the predicted
goodput scaled by the world sizes the run had (as measured).

The work a failure loses follows the tier its restore came from (:mod:`goodput.ledger.tiers`). A failure the
memory tier recovered (from this node's RAM or a peer's replica) loses half the memory tier's measured interval
plus its persist time; one a warm restart recovered live (a survivor's state, no checkpoint read) loses the
step in flight, half a median step; only the rest lose half the durable interval plus W, as in Daly's model
(:func:`goodput.planning.goodput_covered`). Their shares are the run's own restores; a run that saw no restore
but saved to the memory tier assumes the memory tier's default: 30% of failures lose the node, on one node
(:func:`goodput.planning.durable_share`). The memory tier's own stalls, measured inside the durable interval,
take their share ``C1 / (tau1 + C1)`` of it. A run without a memory tier or warm restarts is Daly's model alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from goodput import planning
from goodput.ledger.accounting import Accounting, account
from goodput.ledger.files import read_ledger
from goodput.planning.model import effective_stall

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Advice", "MeasuredModel", "Prediction", "Report", "build_report", "load_report"]


@dataclass(frozen=True)
class MeasuredModel:
    """The planner's inputs as measured (seconds); ``mtbf`` None means no failures seen nor assumed."""

    interval: float | None
    stall: float
    persist: float
    restart: float
    detect: float
    mtbf: float | None
    durable_share: float = 1.0  # of the failures, those only the durable tier recovers
    covered_loss: float = 0.0  # work one of the others loses
    memory_stall_share: float = 0.0  # the memory tier's stalls, C1 / (tau1 + C1), inside the durable interval

    def goodput(self, interval: float | None = None) -> float | None:
        """Planner goodput at ``interval`` (default: the measured one), None without an interval."""
        tau = self.interval if interval is None else interval
        if tau is None or tau <= 0:
            return None
        memory = 1.0 - self.memory_stall_share
        if self.mtbf is None:
            return tau / (tau + effective_stall(tau, self.stall, self.persist)) * memory
        costs = self._costs(self.mtbf)
        if self.durable_share < 1.0:
            share, loss = self.durable_share, self.covered_loss
            return memory * planning.goodput_covered(tau, costs, durable_share=share, covered_loss=loss)
        return planning.goodput_daly(tau, costs) * memory

    def optimum(self) -> float | None:
        """The durable interval that maximises goodput, for the failures only the durable tier recovers."""
        if self.mtbf is None or self.durable_share <= 0.0:
            return None
        return planning.optimal_interval(self._costs(self.mtbf / self.durable_share))

    def _costs(self, mtbf: float) -> planning.Costs:
        return planning.Costs(
            ckpt_stall=self.stall, mtbf=mtbf, restart=self.restart, persist=self.persist, detect=self.detect
        )


@dataclass(frozen=True)
class Prediction:
    """Predicted vs measured: the planner run with the measured figures."""

    mtbf_seconds: float | None
    mtbf_source: str  # "observed", "assumed" (given by the caller) or "none"
    interval_seconds: float | None
    optimal_interval_seconds: float | None
    planner_goodput: float | None
    planner_goodput_optimal: float | None
    modelled_share: float  # of job time, past the first attempt's init
    predicted_goodput: float | None
    restart_estimated: bool
    restart_seconds: float | None = None  # the planner's R; None when it plans no restart (see the docs)
    predicted_capacity_goodput: float | None = None
    shrink: dict[str, float] | None = None  # the shrink model's inputs and answer, for a run that shrank
    durable_share: float = 1.0  # the failures only the durable tier recovers (see the module)
    covered_loss_seconds: float = 0.0  # the work each of the others loses
    durable_share_source: str = "none"  # "observed" (its restores), "assumed" or "none" (no memory tier)
    unmodelled_share: float = 0.0  # of job time: data_wait, warmup, straggler_wait and other


@dataclass(frozen=True)
class Advice:
    """One concrete recommendation; ``gain_points`` is the predicted goodput gain in percentage points
    (None where the gain is correctness rather than speed)."""

    kind: str
    text: str
    gain_points: float | None
    upper_bound: bool = False  # the gain is the most the category allows, not a model prediction


@dataclass(frozen=True)
class Report:
    """Accounting, prediction and advice for one run."""

    run_dir: str
    accounting: Accounting
    prediction: Prediction
    advice: tuple[Advice, ...]
    restores_by_tier: dict[str, dict[str, float]] = field(default_factory=dict)  # see ledger/tiers.py

    def to_dict(self) -> dict[str, Any]:
        """One JSON-able object: goodput, wall_seconds, categories, restarts, predicted_goodput, and more."""
        acc = self.accounting
        out: dict[str, Any] = {
            "run_dir": self.run_dir,
            "goodput": acc.goodput,
            "capacity_goodput": acc.capacity_goodput,
            "wall_seconds": acc.wall_seconds,
            "job_seconds": acc.job_seconds,
            "categories": dict(acc.categories),
            "restarts": acc.restarts,
            "predicted_goodput": self.prediction.predicted_goodput,
            "predicted_capacity_goodput": self.prediction.predicted_capacity_goodput,
        }
        out.update({k: v for k, v in acc.to_dict().items() if k not in out})
        out["prediction"] = asdict(self.prediction)
        out["advice"] = [asdict(a) for a in self.advice]
        out["restores_by_tier"] = self.restores_by_tier
        return out

    def render(self) -> str:
        """The readable table."""
        from goodput.ledger.text import render

        return render(self)


def _shrinks(acc: Accounting) -> int:
    return sum(1 for r in acc.reshapes if r.kind == "shrink")


_ASSUMED_NODE_LOSS = 0.3  # MemoryTier.node_loss_share's default; the ledger does not record the run's


def _covered(acc: Accounting, tiers: Mapping[str, Mapping[str, float]]) -> tuple[float, float, str]:
    """(durable share, work lost per other failure, where the share comes from): see the module."""
    memory = sum(tiers.get(t, {}).get("count", 0.0) for t in ("memory", "peer"))
    live = tiers.get("replica", {}).get("count", 0.0)
    restarted = acc.failures - _shrinks(acc)
    if memory + live > 0 and restarted > 0:
        step = acc.step_stats.median if acc.step_stats is not None else 0.0
        if acc.memory_interval_seconds is not None:
            from_memory = acc.memory_interval_seconds / 2 + (acc.memory_persist_seconds or 0.0)
        else:  # no two memory saves in one attempt: the steps its restores lost, as measured
            from_memory = sum(tiers.get(t, {}).get("lost_steps_mean", 0.0) for t in ("memory", "peer")) * step
        loss = (memory * from_memory + live * step / 2) / (memory + live)
        return 1.0 - min(memory + live, restarted) / restarted, loss, "observed"
    if acc.memory_interval_seconds is not None and not acc.failures:
        loss = acc.memory_interval_seconds / 2 + (acc.memory_persist_seconds or 0.0)
        return planning.durable_share(_ASSUMED_NODE_LOSS, replicated=False), loss, "assumed"
    return 1.0, 0.0, "none"


def _model(acc: Accounting, mtbf: float | None, share: float, loss: float) -> tuple[MeasuredModel, str, bool]:
    """The checkpoint model's inputs: its MTBF counts the failures that were restarts (a shrink rolls back to
    no checkpoint), so a run whose every failure shrank has none."""
    restarted = acc.failures - _shrinks(acc)
    if acc.failures and restarted <= 0:
        used, source = None, "observed"
    elif acc.mtbf_seconds is not None:
        used, source = acc.job_seconds / restarted, "observed"
    elif mtbf is not None:
        used, source = mtbf, "assumed"
    else:
        used, source = None, "none"
    restart, estimated = _restart(acc)
    model = MeasuredModel(
        interval=acc.interval_seconds,
        stall=_staging_stall(acc),
        persist=acc.persist_seconds or 0.0,
        restart=restart,
        detect=acc.detect_seconds or 0.0,
        mtbf=used,
    )
    tau1, c1 = acc.memory_interval_seconds, acc.memory_stall_seconds or 0.0
    memory = c1 / (tau1 + c1) if tau1 is not None and tau1 + c1 > 0 else 0.0
    return (
        replace(model, durable_share=share, covered_loss=loss, memory_stall_share=memory),
        source,
        estimated,
    )


def _staging_stall(acc: Accounting) -> float:
    """The planner's C: the measured stall less the wait for the save in flight that the planner adds itself
    (``max(0, W - interval)``: one save in flight), so that at the measured interval the planner's stall is the
    measured one. Not less the measured wait: W varies from save to save, and the mean of the waits is more
    than the wait at the mean W."""
    wait = max(0.0, (acc.persist_seconds or 0.0) - (acc.interval_seconds or 0.0))
    return max(0.0, (acc.ckpt_stall_seconds or 0.0) - wait)


def _restart(acc: Accounting) -> tuple[float, bool]:
    """R and whether it is an estimate: the restarts' mean cost; without a restart, the rollbacks in place
    (the failures the run did recover from a checkpoint); without either, at least what the first attempt's
    init and restore took."""
    if acc.restart_seconds is not None:
        return acc.restart_seconds, False
    if acc.rollback_seconds is not None:
        return acc.rollback_seconds, False
    first = acc.attempts[0].categories
    return first["init"] + first["checkpoint_restore"], True


def _prediction(
    acc: Accounting, model: MeasuredModel, source: str, estimated: bool, share_source: str
) -> Prediction:
    job = acc.job_seconds
    inside = sum(acc.categories[k] for k in ("data_wait", "warmup", "straggler_wait", "other"))
    share = max(0.0, 1.0 - acc.attempts[0].categories["init"] / job) if job > 0 else 0.0
    unmodelled = inside / job if job > 0 else 0.0

    def comparable(planned: float) -> float:  # see the module
        return max(0.0, planned * share - unmodelled)

    optimum = model.optimum()
    planner = model.goodput()
    shrink = _shrink_model(acc, planner if planner is not None or acc.saves else 1.0)
    capacity: float | None = None
    if shrink is not None:
        planner, capacity = shrink["goodput"], comparable(shrink["capacity_goodput"])
    elif planner is not None:
        capacity = comparable(planner) * (acc.capacity_goodput / acc.goodput if acc.goodput > 0 else 1.0)
    return Prediction(
        mtbf_seconds=acc.mtbf_seconds if acc.failures else model.mtbf,
        mtbf_source=source,
        interval_seconds=model.interval,
        optimal_interval_seconds=optimum,
        planner_goodput=planner,
        planner_goodput_optimal=model.goodput(optimum) if optimum else None,
        modelled_share=share,
        predicted_goodput=None if planner is None else comparable(planner),
        restart_estimated=estimated,
        restart_seconds=model.restart if acc.restarts or model.mtbf is not None else None,
        predicted_capacity_goodput=capacity,
        shrink=shrink,
        durable_share=model.durable_share,
        covered_loss_seconds=model.covered_loss,
        durable_share_source=share_source,
        unmodelled_share=unmodelled,
    )


def _shrink_model(acc: Accounting, base: float | None) -> dict[str, float] | None:
    """The shrink model (:func:`goodput.planning.goodput_shrink`) fed with the run's own figures, per
    failure answered by a shrink; None when nothing shrank (or no checkpoint interval was measured)."""
    shrinks, figures = _shrinks(acc), acc.capacity
    if not shrinks or base is None or figures is None or acc.job_seconds <= 0 or figures.reserved_world < 2:
        return None
    grows = [r.seconds for r in acc.reshapes if r.kind == "grow"]
    inputs = {
        "mtbf": acc.job_seconds / shrinks,
        "shrink": figures.shrink_seconds or 0.0,
        "grow": sum(grows) / shrinks,
        "regrow": (figures.shrink_seconds or 0.0) + (figures.reduced_per_shrink or 0.0),
        "detect": acc.detect_seconds or 0.0,
        "lost": acc.categories["lost_work"] / acc.failures if acc.failures else 0.0,
    }
    answer = planning.goodput_shrink(ranks=figures.reserved_world, base=base, **inputs)
    return {**inputs, "ranks": float(figures.reserved_world), "base": base, **answer.to_dict()}


def build_report(
    events: Iterable[Mapping[str, Any]],
    *,
    run_dir: str = "",
    mtbf: float | None = None,
    rank: int | None = None,
    records: Mapping[tuple[int, int], np.ndarray] | None = None,
) -> Report:
    """Account for the events, run the planner with the measured figures, and derive advice.

    Args:
        events: the ledger events of one rank or of every rank (every attempt).
        run_dir: shown in the report.
        mtbf: an assumed MTBF in seconds, used only while no failure has been observed.
        rank: whose time axis to use (None: the lowest rank present); every rank's events count.
        records: that rank's step records whose steps are not among the events
            (:func:`goodput.ledger.files.read_ledger`).
    """
    from goodput.ledger.advice import advise
    from goodput.ledger.tiers import restores_by_tier

    events = list(events)
    acc = account(events, rank=rank, records=records)

    last_steps = [  # the newest step of each attempt whose steps came as records, for the restores table
        {
            "event": "step_end",
            "attempt": attempt,
            "rank": r,
            "step": int(table["step"][table["end"] == table["end"]].max()),
        }
        for (attempt, r), table in (records or {}).items()
        if (table["end"] == table["end"]).any()
    ]
    tiers = restores_by_tier([*events, *last_steps])
    share, loss, share_source = _covered(acc, tiers)
    model, source, estimated = _model(acc, mtbf, share, loss)
    prediction = _prediction(acc, model, source, estimated, share_source)
    return Report(run_dir, acc, prediction, tuple(advise(acc, model, prediction)), tiers)


def load_report(
    run_dir: str | os.PathLike[str], *, rank: int | None = None, mtbf: float | None = None
) -> Report:
    """:func:`build_report` over every rank's ledger in ``run_dir``, on ``rank``'s time axis (default: the
    lowest rank present).

    Raises:
        ConfigError: when ``run_dir`` holds no ledger.
    """
    events, records = read_ledger(run_dir, primary=rank)
    return build_report(events, run_dir=os.fspath(run_dir), mtbf=mtbf, rank=rank, records=records)
