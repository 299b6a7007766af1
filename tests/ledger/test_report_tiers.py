"""The report's prediction follows the tier each restore came from: the same run, the same costs, with and without
a memory tier (or a warm restart's live recovery), charges each failure the work it really lost."""

from __future__ import annotations

from typing import Any

import pytest

from goodput import planning
from goodput.ledger.report import build_report
from tests.helpers.ledgers import Attempt, synthetic_run

MEMORY_EVERY = 20  # steps of 0.5 s: a memory save every 10 s of compute
STALL = 0.02  # each memory save's, taken from the end of the step it saves


def _with_memory(attempts: list[Attempt], restored: tuple[str, ...]) -> list[dict[str, Any]]:
    """``attempts`` with a memory save every ``MEMORY_EVERY`` steps, and the restore of attempt
    ``i + 1`` from ``restored[i]``: ``memory``, ``durable`` or ``replica`` (a warm restart's live recovery)."""
    events: list[dict[str, Any]] = []
    for a in attempts:
        extra: list[dict[str, Any]] = []
        for e in a.events:
            head = {k: e[k] for k in ("wall", "mono", "attempt", "rank")}
            if e["event"] == "step_end" and e["step"] % MEMORY_EVERY == MEMORY_EVERY // 2:
                for name, before in (("checkpoint_stall_start", STALL), ("checkpoint_stall_end", 0.0)):
                    at = {"wall": e["wall"] - before, "mono": e["mono"] - before}
                    extra.append({**head, **at, "event": name, "step": e["step"], "tier": "memory"})
            elif e["event"] == "restore_end" and a.number > 0:
                tier = restored[a.number - 1]
                if tier == "replica":
                    extra.append(
                        {**head, "event": "warm_restart", "restored_step": e["step"], "generation": a.number}
                    )
                else:
                    extra.append({**head, "event": "checkpoint_restored", "tier": tier, "step": e["step"]})
        events += sorted(a.events + extra, key=lambda e: e["mono"])  # stable: each after its step's end
    return events


def _plain() -> list[dict[str, Any]]:
    return [e for a in synthetic_run() for e in a.events]


def test_without_a_memory_tier_the_prediction_is_daly_s() -> None:
    report = build_report(_plain())
    pred, acc = report.prediction, report.accounting
    assert pred.durable_share == 1.0 and pred.durable_share_source == "none"
    assert acc.memory_interval_seconds is None
    costs = planning.Costs(ckpt_stall=8.0, mtbf=acc.wall_seconds / 2, restart=30.0, persist=2.0)
    daly = planning.goodput_daly(300.0, costs)
    assert pred.planner_goodput == pytest.approx(daly, rel=1e-6)
    assert "durable-tier failures" not in report.render()


def test_failures_the_memory_tier_recovers_lose_half_its_interval() -> None:
    """Two crashes, both restored from the memory tier: each loses ~5 s (half of 10 s), not half the durable
    interval (150 s) plus W."""
    plain = build_report(_plain()).prediction
    report = build_report(_with_memory(synthetic_run(), ("memory", "memory")))
    pred, acc = report.prediction, report.accounting
    assert pred.predicted_goodput is not None and plain.predicted_goodput is not None
    # the same costs: 2 failures x (152 s - 5 s) of lost work less, over a ~2,470 s run
    assert pred.predicted_goodput - plain.predicted_goodput == pytest.approx(2 * 147 / 2470, abs=0.01)
    tau1 = acc.memory_interval_seconds
    assert tau1 is not None and 10.0 - STALL <= tau1 < 10.5  # one gap in 30 holds a durable save's 8 s stall
    assert acc.memory_stall_seconds == pytest.approx(STALL)
    assert pred.durable_share == 0.0 and pred.durable_share_source == "observed"
    assert pred.covered_loss_seconds == pytest.approx(tau1 / 2)
    costs = planning.Costs(ckpt_stall=8.0, mtbf=acc.wall_seconds / 2, restart=30.0, persist=2.0)
    covered = planning.goodput_covered(300.0, costs, durable_share=0.0, covered_loss=tau1 / 2)
    assert pred.planner_goodput == pytest.approx(covered * tau1 / (tau1 + STALL), rel=1e-6)
    assert pred.optimal_interval_seconds is None  # no failure needed the durable tier
    assert "durable-tier failures       0.0% (as restored)" in report.render()


def test_only_the_failures_the_durable_tier_recovered_plan_its_interval() -> None:
    pred = build_report(_with_memory(synthetic_run(), ("memory", "durable"))).prediction
    mtbf = pred.mtbf_seconds
    assert mtbf is not None and pred.durable_share == 0.5
    best = planning.optimal_interval(
        planning.Costs(ckpt_stall=8.0, mtbf=mtbf / 0.5, restart=30.0, persist=2.0)
    )
    assert pred.optimal_interval_seconds == pytest.approx(best, rel=1e-6)


def test_a_live_recovery_loses_the_step_in_flight() -> None:
    pred = build_report(_with_memory(synthetic_run(), ("replica", "replica"))).prediction
    assert pred.durable_share == 0.0 and pred.covered_loss_seconds == pytest.approx(0.25)  # half a 0.5 s step


def test_with_no_failure_seen_the_memory_tier_s_default_share_is_assumed() -> None:
    pred = build_report(_with_memory(synthetic_run(crashes=()), ()), mtbf=3600.0).prediction
    assert pred.durable_share_source == "assumed" and pred.durable_share == pytest.approx(0.3)
