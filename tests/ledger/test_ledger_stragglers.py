"""The straggler detector's events in the accounting and the report: ``straggler_wait``, the per-rank table, the
cost in points, the alarm's advice naming the host (hand-built ledgers, answers worked out by hand)."""

from __future__ import annotations

import pytest

from goodput.ledger.accounting import account
from goodput.ledger.report import build_report
from tests.helpers.ledgers import Attempt


def _run(alarm: bool) -> Attempt:
    """10 steps of 1.5 s (0 to 15 after init 0-1: steps 1-16), two windows of 5 steps where rank 1 took 1.5 s of
    its own per step and rank 0 1.0 s: each window costs 0.5 s x 5 steps of straggler wait."""
    a = Attempt(0, process_start=0.0, start=0.0)
    a.add("init_done", 1.0)
    for i in range(10):
        a.step(i + 1, 1.0 + 1.5 * i, 2.5 + 1.5 * i)
        if (i + 1) % 5 == 0:
            a.add(
                "straggler_window",
                2.5 + 1.5 * i,
                first_step=i - 3,
                last_step=i + 1,
                compute=[1.0, 1.5],
                data=[0.0, 0.0],
                wait=[0.5, 0.0],
                scores=[1.0, 0.6667],
                best_scores=[1.0, 1.0],
                slowest=1,
                cost_seconds=2.5,
            )
    if alarm:
        a.add("straggler_alarm", 16.0, step=10, straggler_rank=1, host="node-b", kind="compute", score=0.6667)
    return a.add("attempt_end", 16.0, status="ok")


def test_the_windows_cost_is_charged_to_straggler_wait_out_of_productive() -> None:
    acc = account(_run(alarm=False).events)
    assert acc.categories["straggler_wait"] == pytest.approx(5.0)
    assert acc.categories["productive"] == pytest.approx(10.0)  # 15 s of steps, 5 of them waiting
    assert sum(acc.categories.values()) == pytest.approx(acc.wall_seconds)


def test_the_report_shows_each_ranks_own_time_and_wait_the_cost_and_goodput_without_stragglers() -> None:
    report = build_report(_run(alarm=True).events)
    text = report.render()
    assert "straggler_wait 5s costs 31.2 points of goodput" in text  # 5 s of a 16 s job
    assert "goodput without stragglers 93.8%" in text  # (10 + 5) / 16
    rows = [line.split() for line in text.splitlines() if line.startswith(("    0 ", "    1 "))]
    assert rows == [["0", "1s", "0s", "0.5s", "1.00", "1.00"], ["1", "1.5s", "0s", "0s", "0.67", "0.67"]]
    assert "rank 1 on host node-b stayed slow in compute" in text
    advice = [a for a in report.advice if a.kind == "straggler"]
    assert len(advice) == 1 and "drain node-b" in advice[0].text
    assert advice[0].gain_points == pytest.approx(100 * 5 / 16)


def test_no_detector_no_section_and_no_straggler_wait() -> None:
    a = Attempt(0, process_start=0.0, start=0.0)
    a.step(1, 0.0, 1.0).add("attempt_end", 1.0, status="ok")
    report = build_report(a.events)
    assert report.accounting.categories["straggler_wait"] == 0.0
    assert "stragglers:" not in report.render()
