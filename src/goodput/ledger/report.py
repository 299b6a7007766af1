"""The run report: where the time went, measured against the planner, and what to change.

:func:`build_report` is pure (events in, report out); :func:`load_report` reads a run folder. The planner
(:mod:`goodput.planning`, Daly's exact model) is run with the *measured* checkpoint stall C, persist time W,
restart time R, detection time D and the observed MTBF M, at the measured checkpoint interval and at its
optimum. The planner models checkpoints and failures only, so the comparable ``predicted_goodput`` is the
planner's goodput times the share of job time (wall time minus between_launches) outside what it does not
model (data_wait, warmup, straggler_wait, other and the first attempt's init).

A run that answered failures by shrinking in place (``shrink`` events: no spare was left) is predicted with
:func:`goodput.planning.goodput_shrink` on top: its measured shrink and grow costs, detection, lost step and
the time it trained short of a rank give the time goodput and the capacity goodput; the checkpoint model then
counts only the failures that were restarts. Without shrinks the predicted capacity goodput is the predicted
goodput scaled by the world sizes the run had (as measured).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from goodput import planning
from goodput.ledger.accounting import Accounting, account
from goodput.ledger.ledger import read_events

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

    def goodput(self, interval: float | None = None) -> float | None:
        """Planner goodput at ``interval`` (default: the measured one), None without an interval."""
        tau = self.interval if interval is None else interval
        if tau is None or tau <= 0:
            return None
        if self.mtbf is None:
            return tau / (tau + self.stall)
        return planning.goodput_daly(
            tau, self.stall, self.mtbf, restart=self.restart, persist=self.persist, detect=self.detect
        )

    def optimum(self) -> float | None:
        if self.mtbf is None:
            return None
        return planning.optimal_interval(
            self.stall, self.mtbf, restart=self.restart, persist=self.persist, detect=self.detect
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
    modelled_share: float
    predicted_goodput: float | None
    restart_estimated: bool
    predicted_capacity_goodput: float | None = None
    shrink: dict[str, float] | None = None  # the shrink model's inputs and answer, for a run that shrank


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


def _model(acc: Accounting, mtbf: float | None) -> tuple[MeasuredModel, str, bool]:
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
    restart, estimated = acc.restart_seconds, False
    if restart is None:  # no restart seen: a restart would cost at least this attempt's init and restore
        first = acc.attempts[0].categories
        restart, estimated = first["init"] + first["checkpoint_restore"], True
    model = MeasuredModel(
        interval=acc.interval_seconds,
        stall=acc.ckpt_stall_seconds or 0.0,
        persist=acc.persist_seconds or 0.0,
        restart=restart,
        detect=acc.detect_seconds or 0.0,
        mtbf=used,
    )
    return model, source, estimated


def _prediction(acc: Accounting, model: MeasuredModel, source: str, estimated: bool) -> Prediction:
    first_init = acc.attempts[0].categories["init"]
    unmodelled = (
        sum(acc.categories[k] for k in ("data_wait", "warmup", "straggler_wait", "other")) + first_init
    )
    share = max(0.0, 1.0 - unmodelled / acc.job_seconds if acc.job_seconds > 0 else 0.0)
    optimum = model.optimum()
    planner = model.goodput()
    shrink = _shrink_model(acc, planner if planner is not None or acc.saves else 1.0)
    capacity: float | None = None
    if shrink is not None:
        planner, capacity = shrink["goodput"], shrink["capacity_goodput"] * share
    elif planner is not None:
        capacity = planner * share * (acc.capacity_goodput / acc.goodput if acc.goodput > 0 else 1.0)
    return Prediction(
        mtbf_seconds=acc.mtbf_seconds if acc.failures else model.mtbf,
        mtbf_source=source,
        interval_seconds=model.interval,
        optimal_interval_seconds=optimum,
        planner_goodput=planner,
        planner_goodput_optimal=model.goodput(optimum) if optimum else None,
        modelled_share=share,
        predicted_goodput=None if planner is None else planner * share,
        restart_estimated=estimated,
        predicted_capacity_goodput=capacity,
        shrink=shrink,
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
) -> Report:
    """Account for the events, run the planner with the measured figures, and derive advice.

    Args:
        events: the ledger events of one rank or of every rank (every attempt).
        run_dir: shown in the report.
        mtbf: an assumed MTBF in seconds, used only while no failure has been observed.
        rank: whose time axis to use (None: the lowest rank present); every rank's events count.
    """
    events = list(events)
    acc = account(events, rank=rank)
    model, source, estimated = _model(acc, mtbf)
    prediction = _prediction(acc, model, source, estimated)
    from goodput.ledger.advice import advise
    from goodput.ledger.tiers import restores_by_tier

    return Report(run_dir, acc, prediction, tuple(advise(acc, model, prediction)), restores_by_tier(events))


def load_report(
    run_dir: str | os.PathLike[str], *, rank: int | None = None, mtbf: float | None = None
) -> Report:
    """:func:`build_report` over every rank's ledger in ``run_dir``, on ``rank``'s time axis (default: the
    lowest rank present).

    Raises:
        ConfigError: when ``run_dir`` holds no ledger.
    """
    from goodput.ledger.ledger import ledger_files

    ranks = {f.rank for f in ledger_files(run_dir)}
    primary = rank if rank in ranks else min(ranks, default=None)
    events = read_events(run_dir, rank=None, steps_of=primary)
    if not any(e.get("event") == "attempt_start" and e.get("rank", 0) == primary for e in events):
        events = read_events(run_dir, rank=None)  # the merge will take another rank's time axis: read it all
    return build_report(events, run_dir=os.fspath(run_dir), mtbf=mtbf, rank=rank)
