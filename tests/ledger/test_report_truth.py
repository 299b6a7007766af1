"""The report's figures against runs whose truth is known: ledgers written through the Ledger API on a clock
the test sets (tests/helpers/groups.py), each figure worked out from the scenario, not from the report's code.

A warm run with no spare shrinks 3 -> 2 -> 1 and grows back 1 -> 2 -> 3 as the warm agent does it: the survivors
open an attempt per generation, and each newcomer is a new process that numbers its attempts from its rank's
ledger files (rank 1's newcomer is its attempt 2, rank 2's its attempt 1), opened when it is handed the rank,
before the survivors leave the generation before. Steps take 1 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.ledger.plot import report_figure
from goodput.ledger.report import build_report, load_report
from goodput.units import format_duration as fd
from tests.helpers.groups import Clock, Group, set_clock
from tests.helpers.ledgers import Attempt, synthetic_run

FAILED_AT = (5.5, 11.5)  # rank 2 dies in step 6, rank 1 in step 10
DETECTED = (6.0, 12.0)
READY = (17.0, 18.1)  # a newcomer is ready for the first grow, then for the second
STEP_STARTS = (5.0, 11.0)  # of the steps the failures interrupt


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return set_clock(monkeypatch)


def _reshape(
    group: Group, kind: str, generation: int, step: int, worlds: tuple[int, int], since: float
) -> None:
    """Every rank of ``group`` records the generation's warm_restart and its shrink or grow."""
    group.event("warm_restart", generation=generation, role="survivor", restored_step=step - 1)
    extra = (
        {"failed_ranks": [worlds[1]], "batch_rule": "per_rank_batch"} if kind == "shrink" else {"joined": 1}
    )
    seconds = group.clock.t - since
    group.event(kind, generation=generation, step=step, world_before=worlds[0], world_after=worlds[1],
                seconds=seconds, **extra)  # fmt: skip


def _lose(group: Group, rank: int, failure: int) -> None:
    """``rank`` dies at ``FAILED_AT[failure]`` and the rest of ``group`` fails at ``DETECTED[failure]``."""
    group.clock.t = FAILED_AT[failure]
    group.lose(rank)
    group.clock.t = DETECTED[failure]
    group.fail(f"peer failure: rank {rank}")


def _shrink_and_grow_back(run_dir: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    def group(ranks: list[int], attempt: int, world: int) -> Group:
        return Group(run_dir, clock, ranks, attempt=attempt, world=world, reserved=3, monkeypatch=monkeypatch)

    full = group([0, 1, 2], 0, 3)
    full.steps(1, 5)
    full.start_step(6)
    _lose(full, 2, 0)
    clock.t = 6.2
    two = group([0, 1], 1, 2)
    clock.t = 6.5
    _reshape(two, "shrink", 1, 6, (3, 2), DETECTED[0])
    clock.t = 7.0
    two.steps(6, 4)  # to t = 11
    two.start_step(10)
    _lose(two, 1, 1)
    clock.t = 12.2
    one = group([0], 2, 1)
    clock.t = 12.5
    _reshape(one, "shrink", 2, 10, (2, 1), DETECTED[1])
    clock.t = 13.0
    one.steps(10, 4)  # to t = 17
    clock.t = 17.1
    grown = group([1], 2, 2)  # the newcomer, handed rank 1
    clock.t = 17.2
    one.fail("peer failure: generation 2 ended: leaving before step 14")
    clock.t = 17.4
    grown.join(0, 3)
    clock.t = 17.8
    _reshape(grown, "grow", 3, 14, (1, 2), READY[0])
    clock.t = 18.0
    grown.steps(14, 1)  # to t = 19
    clock.t = 18.2
    full = group([2], 1, 3)  # the next newcomer, handed rank 2 while step 14 trains
    clock.t = 19.0
    grown.fail("peer failure: generation 3 ended: leaving before step 15")
    clock.t = 19.1
    full.join(1, 3)
    full.join(0, 4)
    clock.t = 19.6
    _reshape(full, "grow", 4, 15, (2, 3), READY[1])
    clock.t = 20.0
    full.steps(15, 5)  # to t = 25
    full.close()


def test_a_shrink_and_grow_run_reports_each_reshape_once_and_no_restore(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shrink_and_grow_back(tmp_path, clock, monkeypatch)
    report = load_report(tmp_path)
    acc = report.accounting
    assert [(r.kind, r.world_before, r.world_after, r.step) for r in acc.reshapes] == [
        ("shrink", 3, 2, 6),
        ("shrink", 2, 1, 10),
        ("grow", 1, 2, 14),
        ("grow", 2, 3, 15),
    ]
    assert [r.seconds for r in acc.reshapes[:2]] == [
        pytest.approx(7.0 - DETECTED[0]),
        pytest.approx(13.0 - DETECTED[1]),
    ]
    assert (acc.failures, acc.restarts) == (2, 0)
    # each interrupted step's work up to the failure, one typical step at most: no step was redone
    assert acc.categories["lost_work"] == pytest.approx(
        sum(d - s for d, s in zip(DETECTED, STEP_STARTS, strict=True))
    )
    assert report.restores_by_tier == {}  # the survivors kept their state: nothing was restored
    text = report.render()
    assert "restores from" not in text
    assert text.count("    grow ") == 2 and text.count("    shrink ") == 2, text
    assert "R restart                   n/a (no restart" in text
    assert "optimal n/a (every failure shrank in place" in text


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A user's script (tests/run/test_numeric_ledger.py's) whose poisoned sample makes the guard roll back
    twice from step 10 to step 8 and then skip it: two failures, no restart."""
    from tests.run.test_numeric_ledger import _run, _train

    run_dir = str(tmp_path_factory.mktemp("rolled_back"))
    _train(_run(run_dir), lambda: False)
    return run_dir


def test_a_run_that_only_rolled_back_reports_no_restart_and_the_rollbacks_cost(rolled_back: str) -> None:
    """R is what the rollbacks cost, as the ledger's rollback attempts add up; no restart is advised, and
    each figure the report prints is set."""
    report = load_report(rolled_back)
    acc, text = report.accounting, report.render()
    assert "(est." not in text and "no restart: a rollback in place" in text
    assert (acc.failures, acc.restarts) == (2, 0)
    rolled_back = [a.categories for a in acc.attempts[1:]]
    cost = sum(c["restart_downtime"] + c["rollback"] for c in rolled_back) / len(rolled_back)
    assert report.prediction.restart_seconds == pytest.approx(cost)
    assert "restart" not in {a.kind for a in report.advice}
    memory = report.restores_by_tier["memory"]
    assert (memory["count"], memory["lost_steps_mean"]) == (2.0, 10 - 8)
    assert "None" not in text and "optimal n/a (" in text


def test_the_restart_advice_names_the_r_the_report_prints_and_its_parts_add_up_to_it() -> None:
    """Two crashes, each restarted after 200 s of downtime, 6 s of init and a 4 s restore (no detection
    delay): R is 210 s on the R line and in the advice, which lists the same three parts."""
    report = build_report([e for a in synthetic_run(downtime=200.0) for e in a.events])
    text = report.render()
    assert f"R restart                   {fd(210.0)} = downtime {fd(200.0)} + init 6s + restore 4s" in text
    (advice,) = [a for a in report.advice if a.kind == "restart"]
    assert f"R {fd(210.0)} (downtime {fd(200.0)}, init 6s, restore 4s) after a detection of 0s" in advice.text


def test_the_plot_of_a_rollback_run_names_rollbacks_not_failures_nor_restarts(rolled_back: str) -> None:
    import matplotlib.pyplot as plt

    fig = report_figure(load_report(rolled_back))
    timeline, goodput = fig.axes[:2]
    labels = [t.get_text() for t in timeline.get_yticklabels()]
    plt.close(fig)
    assert labels == ["attempt 0 (rolled back)", "attempt 1 (rolled back)", "attempt 2 (ok)"]
    assert goodput.get_xlabel().endswith("grey lines: 2 rollbacks")


def test_the_plot_of_a_shrink_and_grow_run_keeps_its_ranks_axis_whole_and_clear(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt

    _shrink_and_grow_back(tmp_path, clock, monkeypatch)
    fig = report_figure(load_report(tmp_path))
    fig.canvas.draw()
    _, goodput, ranks = fig.axes
    ticks = [t for t in ranks.get_yticks() if 0 <= t <= 3]
    render = fig.canvas.get_renderer()
    legend, axis = goodput.get_legend().get_window_extent(render), ranks.get_tightbbox(render)
    xlabel = goodput.get_xlabel()
    plt.close(fig)
    assert ticks == [0, 1, 2, 3]  # whole ranks
    assert legend.x0 > axis.x1  # the legend starts right of the ranks axis' ticks and label
    assert xlabel.endswith("grey lines: 2 grows, 2 shrinks") and "restart" not in xlabel


@pytest.mark.slow
def test_a_real_warm_run_that_shrinks_to_one_and_grows_back_is_reported_as_the_agent_saw_it(
    tmp_path: Path,
) -> None:
    """``goodput launch --restart warm --spares 0 --shrink-after 0`` on 3 ranks, ranks 2 and 1 SIGKILLed: the
    agent shrinks 3 -> 2 -> 1 and grows back to 3 (its log, warm/agent.jsonl, is the truth): 1 -> 2 -> 3, or
    1 -> 3 in one grow when both replacements are ready by the first grow. A replacement, forked from the node's
    template, is ready at once: the script holds it until step 9, past the second kill."""
    import json

    from tests.warm.test_shrink import _warm

    run_dir = str(tmp_path / "run")
    _warm(run_dir, 3, "kill@step=4,rank=2;kill@step=8,rank=1", hold="12,16", steps=24, spare_after="9")
    with open(f"{run_dir}/warm/agent.jsonl") as f:
        agent = [json.loads(line) for line in f]
    seen = [
        (e["event"], e["world_before"], e["world_after"]) for e in agent if e["event"] in ("shrink", "grow")
    ]
    assert seen[:2] == [("shrink", 3, 2), ("shrink", 2, 1)]
    assert seen[2:] in ([("grow", 1, 2), ("grow", 2, 3)], [("grow", 1, 3)]), seen
    report = load_report(run_dir)
    acc, text = report.accounting, report.render()
    assert [(r.kind, r.world_before, r.world_after) for r in acc.reshapes] == seen
    assert (acc.failures, acc.restarts) == (2, 0)
    assert "replica" not in report.restores_by_tier and "restores from replica" not in text
    assert "(est." not in text and "R restart                   n/a (no restart" in text


@pytest.mark.parametrize("mtbf", [None, 1e7])
@pytest.mark.parametrize("unmodelled", [0.0, 0.01])
def test_a_failure_free_prediction_is_the_measured_goodput(mtbf: float | None, unmodelled: float) -> None:
    """Asynchronous saves after every 50 ms step, each staged in 10 ms and durable 80 ms later: every save but the
    first waits 30 ms for the one in flight, so a cycle is 50 + 30 + 10 ms. The stall the ledger measures holds
    the wait; the planner adds a wait of its own (W - interval), so it must be given the stall less its wait.
    With ``unmodelled``, each step first waits that long for its batch (data_wait, inside the interval the
    planner takes for training, 60 ms: the save in flight then waits 20 ms). Failure-free or at a failure every
    10^7 s, the prediction is then the measured goodput."""
    a = Attempt(0, 0.0, 0.0, launch="L", restart_count=0)
    a.add("init_done", 1.0)
    t, durable = 1.0, 0.0
    for n in range(1, 401):
        a.step(n, t, t + unmodelled + 0.05, fetch=unmodelled)
        t += unmodelled + 0.05
        waited = max(0.0, durable - t)
        durable = t + waited + 0.01 + 0.08
        a.save(n, t, t + waited + 0.01, durable=durable, waited=waited)
        t += waited + 0.01
    a.add("attempt_end", t, status="ok")
    report = build_report(a.events, mtbf=mtbf)
    cycle = 0.05 + unmodelled + 0.01 + (0.08 - 0.05 - unmodelled)
    assert report.prediction.planner_goodput == pytest.approx((0.05 + unmodelled) / cycle, rel=0.01)
    assert report.prediction.predicted_goodput == pytest.approx(report.accounting.goodput, rel=0.01)


def test_a_failure_free_prediction_is_the_measured_goodput_when_persist_times_vary() -> None:
    """As above, but the saves persist in 130 ms and 30 ms by turns (80 ms on average): after a slow one the next
    save waits 80 ms, after a fast one none, so the stall is 50 ms on average where a mean W's wait would be
    30 ms. The planner is given the stall less its own wait at the mean W, so at the measured interval its stall
    is the measured one."""
    a = Attempt(0, 0.0, 0.0, launch="L", restart_count=0)
    a.add("init_done", 1.0)
    t, durable = 1.0, 0.0
    for n in range(1, 401):
        a.step(n, t, t + 0.05)
        t += 0.05
        waited = max(0.0, durable - t)
        durable = t + waited + 0.01 + (0.13 if n % 2 else 0.03)
        a.save(n, t, t + waited + 0.01, durable=durable, waited=waited)
        t += waited + 0.01
    a.add("attempt_end", t, status="ok")
    report = build_report(a.events)
    assert report.prediction.planner_goodput == pytest.approx(0.05 / 0.10, rel=0.01)  # a cycle: 50 + 50 ms
    assert report.prediction.predicted_goodput == pytest.approx(report.accounting.goodput, rel=0.01)
