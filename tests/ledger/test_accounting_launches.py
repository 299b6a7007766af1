"""What a failure costs and what is not one: hand-built ledgers shaped like real runs' (their figures measured
on real launches), with the answers worked out by hand in each docstring.

- the unfinished step of a failed attempt is lost work only for as long as a step lasts: a survivor's wait on
  a dead peer, its exit after torchrun's SIGTERM or a warm restart's re-form is downtime;
- time between two launches (a relaunch by hand, a scheduler's requeue and queue wait) is ``between_launches``,
  outside goodput's denominator and the MTBF;
- a preemption (Ctrl-C, SIGTERM, the preemption signal) is not a failure.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.ledger.accounting import CATEGORIES, account, goodput_over_time
from goodput.ledger.report import build_report
from tests.helpers.ledgers import Attempt, synthetic_run


def _steps(a: Attempt, first: int, last: int, start: float, seconds: float) -> float:
    """Steps ``first``..``last`` of ``seconds`` each from ``start``; returns the time after the last."""
    for n in range(first, last + 1):
        a.step(n, start, start + seconds)
        start += seconds
    return start


def test_a_survivors_exit_after_sigterm_is_downtime_not_lost_work() -> None:
    """A Lightning run under goodput launch (2 ranks, steps of 6 ms; rank 1 SIGKILLed after step 6). Rank 0,
    the survivor, saved step 4 (a 40 ms stall), opened step 7 and its process ended 6.5 s later, after
    torchrun's SIGTERM. Attempt 1 starts 2.5 s after that and restores step 4.

    Lost work: steps 5-6 (12 ms, redone) and 6 ms of step 7 (one step's duration); the other 6.494 s of the
    survivor's exit and the 2.5 s gap are restart_downtime, charged to attempt 1, and count in R.
    """
    a0 = Attempt(0, 0.0, 0.0, launch="L", restart_count=0)
    a0.add("init_done", 13.0)
    t = _steps(a0, 1, 4, 13.0, 0.006)
    a0.save(4, t, t + 0.04, durable=t + 0.04)
    t = _steps(a0, 5, 6, t + 0.04, 0.006)
    a0.add("step_start", t, step=7).add("attempt_end", t + 6.5, status="failed")
    a1 = Attempt(1, t + 9.0, t + 9.0, launch="L", restart_count=1)
    a1.add("restore_start", t + 9.0).add("restore_end", t + 9.5, step=4)
    _steps(a1, 5, 20, t + 9.5, 0.006)
    a1.add("attempt_end", t + 9.5 + 16 * 0.006, status="ok")
    acc = account(a0.events + a1.events)
    assert acc.categories["lost_work"] == pytest.approx(3 * 0.006, abs=1e-9)
    assert acc.categories["restart_downtime"] == pytest.approx(6.5 - 0.006 + 2.5, abs=1e-9)
    assert acc.attempts[1].categories["restart_downtime"] == pytest.approx(6.494 + 2.5, abs=1e-9)
    assert acc.restart_seconds == pytest.approx(6.494 + 2.5 + 0.5, abs=1e-9)  # downtime + init 0 + restore
    assert sum(acc.categories.values()) == pytest.approx(acc.wall_seconds, abs=1e-9)
    assert [seg.start for seg in acc.segments] == sorted(seg.start for seg in acc.segments)


def test_a_warm_restarts_re_form_is_downtime_not_lost_work() -> None:
    """A warm launch (steps of 0.1 s): rank 1 dies in step 26; rank 0 waits 4 s in its unfinished step
    while the group re-forms, then ends the generation; the next generation takes step 25 from rank 0's
    replica (nothing completed was lost). Lost work is the 0.1 s of step 26, not the 4 s (half of this 8 s
    run before the fix); the re-form is restart_downtime."""
    a0 = Attempt(0, 0.0, 1.0, launch="W", restart_count=0)
    a0.add("init_done", 1.0)
    t = _steps(a0, 1, 25, 1.0, 0.1)
    a0.add("step_start", t, step=26).add("attempt_end", t + 4.0, status="failed")
    a1 = Attempt(1, t + 4.0, t + 4.0, launch="W", restart_count=0)
    a1.add("restore_start", t + 4.0).add("warm_restart", t + 4.0, restored_step=25, generation=1)
    a1.add("restore_end", t + 4.0, step=25)
    end = _steps(a1, 26, 30, t + 4.0, 0.1)
    a1.add("attempt_end", end, status="ok")
    acc = account(a0.events + a1.events)
    assert acc.wall_seconds == pytest.approx(8.0)
    assert acc.categories["lost_work"] == pytest.approx(0.1, abs=1e-9)
    assert acc.categories["restart_downtime"] == pytest.approx(3.9, abs=1e-9)
    assert (acc.restarts, acc.failures, acc.launches) == (1, 1, 1)


def _preempted_then_relaunched(*, gap: float, ids: tuple[Any, Any], counts: tuple[Any, Any]) -> list[Any]:
    """Launch 1: init 3 s, 100 steps of 1 s, a 1 s save after step 50; Ctrl-C after step 100: the agreed
    save of step 100 (a 1 s stall), ``preempted``, attempt_end "interrupted" at 105. Launch 2 starts ``gap``
    seconds later: init 3 s, restore 1 s, 100 steps, ends ok."""
    head0 = {k: v for k, v in (("launch", ids[0]), ("restart_count", counts[0])) if v is not None}
    head1 = {k: v for k, v in (("launch", ids[1]), ("restart_count", counts[1])) if v is not None}
    a0 = Attempt(0, 0.0, 0.0, **head0)
    a0.add("init_done", 3.0)
    t = _steps(a0, 1, 50, 3.0, 1.0)
    a0.save(50, t, t + 1.0, durable=t + 1.0)
    t = _steps(a0, 51, 100, t + 1.0, 1.0)
    a0.save(100, t, t + 1.0, durable=t + 1.0)
    a0.add("preempted", t + 1.0, step=100, signal="SIGINT", url="ckpt/step-100")
    a0.add("attempt_end", t + 1.0, status="interrupted")
    start = t + 1.0 + gap
    a1 = Attempt(1, start, start, **head1)
    a1.add("restore_start", start + 3.0).add("restore_end", start + 4.0, step=100)
    end = _steps(a1, 101, 200, start + 4.0, 1.0)
    a1.add("attempt_end", end, status="ok")
    return a0.events + a1.events


def test_a_relaunch_nine_minutes_later_is_time_between_launches_and_ctrl_c_is_no_failure() -> None:
    """Two launches 565 s apart (the user's relaunch; a scheduler's queue wait is the same): wall 774 s, of
    which 565 s between launches. The job's own time is 209 s (105 + 104), 200 of them productive steps. The
    Ctrl-C is a preemption: no failure, no MTBF, no restart cost."""
    acc = account(_preempted_then_relaunched(gap=565.0, ids=("L1", "L2"), counts=(0, 0)))
    assert acc.wall_seconds == pytest.approx(774.0)
    assert acc.categories["between_launches"] == pytest.approx(565.0)
    assert acc.categories["restart_downtime"] == 0.0
    assert acc.job_seconds == pytest.approx(209.0)
    assert acc.goodput == pytest.approx(200.0 / 209.0)  # 26% of the wall: 0.6% in the user's longer gap
    assert sum(acc.categories.values()) == pytest.approx(acc.wall_seconds)
    assert (acc.failures, acc.preemptions, acc.mtbf_seconds) == (0, 1, None)
    assert (acc.launches, acc.restarts, acc.restart_seconds) == (2, 0, None)
    assert [a.outcome for a in acc.attempts] == ["preempted", "ok"]
    assert [a.launch for a in acc.attempts] == [0, 1]
    report = build_report(_preempted_then_relaunched(gap=565.0, ids=("L1", "L2"), counts=(0, 0)))
    assert report.prediction.mtbf_source == "none"
    text = report.render()
    assert "between_launches" in text and "2 launches" in text and "1 preemption(s), not failures" in text
    assert "restart" not in {a.kind for a in report.advice}


def test_launches_are_told_apart_by_their_id_else_by_torchruns_restart_count() -> None:
    """One launch: the same id, or no id and a restart count that goes on (torchrun restarted the group). A
    new launch: another id, or no id and the count back at 0 (a new torchrun). A ledger with neither (hand
    written) is one launch."""
    cases = {
        ("A", "A", 0, 0): 1,  # a warm restart's attempt under one goodput launch keeps the count at 0
        ("A", "B", 0, 0): 2,
        ("A", "B", 3, 3): 2,
        (None, None, 0, 1): 1,
        (None, None, 2, 0): 2,
        (None, None, None, None): 1,
    }
    for (id0, id1, c0, c1), launches in cases.items():
        acc = account(_preempted_then_relaunched(gap=10.0, ids=(id0, id1), counts=(c0, c1)))
        assert acc.launches == launches, (id0, id1, c0, c1)
        gap = "between_launches" if launches == 2 else "restart_downtime"
        assert acc.categories[gap] == pytest.approx(10.0), (id0, id1, c0, c1)


def test_the_relaunch_after_a_failed_launch_is_a_start_r_is_the_mean_of() -> None:
    """A launch whose launcher was SIGKILLed (its attempt ends "failed" after step 20), relaunched 3 s later:
    the new launch's init (7 s: imports and the group's start) and restore (0.5 s) are what the failure cost,
    as a restart's are; the 3 s between launches are not the job's. One restart before it, within the first
    launch, took 0.2 s downtime + 0.3 s init + 0.1 s restore. R = (0.6 + 7.5) / 2 = 4.05 s, over 2 starts."""
    a0 = Attempt(0, 0.0, 0.0, launch="L1", restart_count=0)
    a0.add("init_done", 2.0)
    t = _steps(a0, 1, 10, 2.0, 0.1)
    a0.add("step_start", t, step=11).add("attempt_end", t, status="failed")
    a1 = Attempt(1, t + 0.2, t + 0.2, launch="L1", restart_count=1)
    a1.add("init_done", t + 0.5).add("restore_start", t + 0.5).add("restore_end", t + 0.6, step=10)
    t = _steps(a1, 11, 20, t + 0.6, 0.1)
    a1.add("attempt_end", t, status="failed")
    a2 = Attempt(2, t + 3.0, t + 3.0, launch="L2", restart_count=0)
    a2.add("init_done", t + 10.0).add("restore_start", t + 10.0).add("restore_end", t + 10.5, step=20)
    t = _steps(a2, 21, 30, t + 10.5, 0.1)
    a2.add("attempt_end", t, status="ok")
    acc = account(a0.events + a1.events + a2.events)
    assert (acc.restarts, acc.failures, acc.launches, acc.restart_samples) == (1, 2, 2, 2)
    assert acc.categories["between_launches"] == pytest.approx(3.0)
    assert acc.restart_seconds == pytest.approx((0.2 + 0.3 + 0.1 + 7.0 + 0.5) / 2)
    assert (
        "mean of 1 restart(s) and 1 relaunch(es) after a failure"
        in build_report(a0.events + a1.events + a2.events).render()
    )


def test_a_failure_counts_and_a_preemption_does_not() -> None:
    """The synthetic run's two crashes, with a preemption recorded in the last attempt: 2 failures, the
    MTBF is the job time over 2, and the last attempt is "preempted", not "failed"."""
    attempts = synthetic_run()
    last = attempts[-1]
    last.events[-1] = {**last.events[-1], "status": "interrupted"}
    last.add("preempted", last.events[-1]["wall"], step=1, signal="SIGTERM", url=None)
    acc = account([e for a in attempts for e in a.events])
    assert [a.outcome for a in acc.attempts] == ["failed", "failed", "preempted"]
    assert (acc.failures, acc.preemptions) == (2, 1)
    assert acc.mtbf_seconds == pytest.approx(acc.job_seconds / 2)


def _on_auto(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run as one on every="auto" records it: checkpoint_config names no fixed interval."""
    return [
        {k: v for k, v in e.items() if k != "every_steps"} if e["event"] == "checkpoint_config" else e
        for e in events
    ]


def test_interval_advice_does_not_tell_a_run_on_auto_to_use_auto() -> None:
    events = [e for a in synthetic_run(every_steps=600, strategy="dcp_async") for e in a.events]
    fixed = {a.kind: a for a in build_report(events).advice}["interval"]
    assert 'let every="auto" tune it' in fixed.text
    auto = {a.kind: a for a in build_report(_on_auto(events)).advice}["interval"]
    assert "every=" in auto.text and 'let every="auto"' not in auto.text
    assert 'the run is on every="auto"' in auto.text and auto.gain_points == fixed.gain_points


_KINDS = st.sampled_from(["step", "open", "save", "detect", "end_ok", "end_failed", "end_interrupted", "gap"])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.tuples(_KINDS, st.floats(0.0, 3.0)), max_size=12),
            st.sampled_from(["A", "B", None]),
            st.sampled_from([0, 1, None]),
            st.floats(0.0, 20.0),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_categories_tile_wall_time_across_attempts_and_launches(
    attempts: list[tuple[list[tuple[str, float]], str | None, int | None, float]],
) -> None:
    """Whatever the attempts, launches, failures, preemptions and gaps, the categories (between_launches
    included) are >= 0 and sum to the wall time, and goodput stays within [0, 1] of the job time."""
    events: list[dict[str, Any]] = []
    t, step = 0.0, 0
    for number, (body, launch, count, gap) in enumerate(attempts):
        t += gap
        head = {k: v for k, v in (("launch", launch), ("restart_count", count)) if v is not None}
        a = Attempt(number, t, t, mono_origin=50.0 * number, **head)
        for kind, dt in body:
            t += dt
            if kind == "step":
                step += 1
                a.step(step, t - dt, t)
            elif kind == "open":
                a.add("step_start", t, step=step + 1)
            elif kind == "save":
                a.save(step, t - dt, t, durable=t)
            elif kind == "detect":
                a.add("failure_detected", t, reason="hang", silent_seconds=dt)
            elif kind == "gap":
                a.add("eval", t)
            else:
                a.add("attempt_end", t, status=kind.removeprefix("end_"))
        events += a.events
    acc = account(events)
    assert set(acc.categories) == set(CATEGORIES)
    assert all(v >= 0.0 for v in acc.categories.values())
    assert sum(acc.categories.values()) == pytest.approx(acc.wall_seconds, abs=1e-9)
    assert acc.job_seconds <= acc.wall_seconds + 1e-9
    assert 0.0 <= acc.goodput <= 1.0 + 1e-9
    assert all(-1e-9 <= g <= 1.0 + 1e-9 for _, g in goodput_over_time(acc, window=1.0, points=20))
