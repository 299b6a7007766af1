"""Hand-built ledgers with answers worked out by hand (see each docstring), and the tiling invariant."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.ledger.accounting import CATEGORIES, account, goodput_over_time
from tests.helpers.ledgers import Attempt as _Attempt


def _expect(**seconds: float) -> dict[str, float]:
    return {name: seconds.get(name, 0.0) for name in CATEGORIES}


def _approx(categories: dict[str, float]) -> dict[str, Any]:
    return {k: pytest.approx(v, abs=1e-9) for k, v in categories.items()}


def test_clean_run() -> None:
    """Process start 0; restore 2-3; step 1 (3-5, fetch 0.5) then steps of 1 s with 0.25 s fetch.

    Computes: 1.5 then 0.75 x5, median 0.75, so step 1 is warm-up by 1.5 - 0.75 = 0.75.
    init = 3 - 1 (restore) = 2; data_wait = 0.5 + 5 x 0.25; productive = 0.75 x 6; stall 8-8.5;
    other = 10.5-11 (before attempt_end). Sum 11 = wall.
    """
    a = _Attempt(0, process_start=0.0, start=1.0)
    a.add("init_done", 2.0).add("restore_start", 2.0).add("restore_end", 3.0, step=None)
    a.step(1, 3.0, 5.0, fetch=0.5).step(2, 5.0, 6.0, 0.25).step(3, 6.0, 7.0, 0.25).step(4, 7.0, 8.0, 0.25)
    a.save(4, 8.0, 8.5, durable=9.5)
    a.step(5, 8.5, 9.5, 0.25).step(6, 9.5, 10.5, 0.25).add("eval", 10.9, seconds=0.4, accuracy=0.5)
    acc = account(a.add("attempt_end", 11.0, status="ok").events)
    assert acc.wall_seconds == pytest.approx(11.0)
    assert acc.categories == _approx(
        _expect(
            init=2.0,
            checkpoint_restore=1.0,
            data_wait=1.75,
            warmup=0.75,
            productive=4.5,
            checkpoint_stall=0.5,
            other=0.5,
        )
    )
    assert acc.goodput == pytest.approx(4.5 / 11.0)
    assert (acc.restarts, acc.failures, acc.mtbf_seconds) == (0, 0, None)
    assert acc.ckpt_stall_seconds == pytest.approx(0.5)
    assert acc.persist_seconds == pytest.approx(1.0)  # stall end 8.5 to durable 9.5
    assert acc.overlap_seconds == pytest.approx(1.0)
    assert acc.attempts[0].outcome == "ok"
    assert acc.step_stats is not None and acc.step_stats.count == 6
    assert acc.step_stats.median == pytest.approx(1.0)
    assert acc.info["custom"] == {"eval": {"count": 1, "seconds": pytest.approx(0.4)}}


def _two_crashes() -> list[dict[str, Any]]:
    a0 = _Attempt(0, 0.0, 0.0, mono_origin=100.0)
    a0.step(1, 1, 2).step(2, 2, 3).save(2, 3, 3.5, durable=4.5).step(3, 3.5, 4.5).step(4, 4.5, 5.5)
    a1 = _Attempt(1, 7.5, 8.0, mono_origin=50.0)
    a1.add("restore_start", 8.5).add("restore_end", 9.5, step=2)
    a1.step(3, 9.5, 10.5).step(4, 10.5, 11.5).save(4, 11.5, 12.0, durable=12.5).step(5, 12, 13).step(
        6, 13, 14
    )
    a2 = _Attempt(2, 15.0, 15.2, mono_origin=7.0)
    a2.add("restore_start", 15.5).add("restore_end", 16.0, step=4)
    a2.step(5, 16, 17).step(6, 17, 18).add("attempt_end", 18.5, status="ok")
    return a0.events + a1.events + a2.events


def test_two_crashes() -> None:
    """Attempt 0 (0-5.5) dies after step 4, durable at step 2: steps 3-4 lost (2 s); init 1, stall 0.5.

    Downtime 5.5-7.5. Attempt 1 (7.5-14) restores step 2 (8.5-9.5), init 7.5-8.5; dies after step 6 with
    step 4 durable: steps 5-6 lost (2 s). Downtime 14-15. Attempt 2 (15-18.5): init 0.5, restore 0.5,
    steps 5-6 productive, 0.5 other. Every step takes 1 s of compute, so there is no warm-up.
    """
    acc = account(_two_crashes())
    assert acc.wall_seconds == pytest.approx(18.5)
    assert acc.categories == _approx(
        _expect(
            init=2.5,
            checkpoint_restore=1.5,
            productive=6.0,
            checkpoint_stall=1.0,
            lost_work=4.0,
            restart_downtime=3.0,
            other=0.5,
        )
    )
    assert (acc.restarts, acc.failures) == (2, 2)
    assert acc.mtbf_seconds == pytest.approx(18.5 / 2)
    # restart cost = downtime + init + restore of the next attempt: (2 + 1 + 1) and (1 + 0.5 + 0.5)
    assert acc.restart_seconds == pytest.approx(3.0)
    assert [x.outcome for x in acc.attempts] == ["failed", "failed", "ok"]
    assert [x.restored_step for x in acc.attempts] == [None, 2, 4]
    assert [x.categories["restart_downtime"] for x in acc.attempts] == pytest.approx([0.0, 2.0, 1.0])
    assert acc.interval_seconds is None  # one save per attempt, no configured interval


def test_input_order_does_not_matter() -> None:
    events = _two_crashes()
    assert account(list(reversed(events))).categories == account(events).categories


def test_crash_during_async_save() -> None:
    """Save of step 3 stalls 4.5-5.0, then the process dies at 7 before that save is durable.

    Attempt 0 (0-7): init 1, steps 1-2 productive (2), stalls 0.5 + 0.5, steps 3-5 lost (3 s) because the
    next attempt restores step 2. Downtime 7-9. Attempt 1 (9-12): init 1, restore 1, step 3 productive.
    """
    a0 = _Attempt(0, 0.0, 0.5)
    a0.step(1, 1, 2).step(2, 2, 3).save(2, 3.0, 3.5, durable=4.0).step(3, 3.5, 4.5)
    a0.save(3, 4.5, 5.0, durable=None).step(4, 5, 6).step(5, 6, 7)
    a1 = _Attempt(1, 9.0, 9.5)
    a1.add("restore_start", 10.0).add("restore_end", 11.0, step=2).step(3, 11, 12)
    a1.add("attempt_end", 12.0, status="ok")
    acc = account(a0.events + a1.events)
    assert acc.categories == _approx(
        _expect(
            init=2.0,
            productive=3.0,
            checkpoint_stall=1.0,
            lost_work=3.0,
            restart_downtime=2.0,
            checkpoint_restore=1.0,
        )
    )
    assert acc.ckpt_stall_seconds == pytest.approx(0.5)
    assert acc.persist_seconds == pytest.approx(0.5)  # only the durable save (stall end 3.5 -> 4.0)
    assert acc.interval_seconds == pytest.approx(1.0)  # compute between saves: 3.5 -> 4.5
    assert [s.durable is None for s in acc.saves] == [False, True]


def test_hang_detected_by_timeout() -> None:
    """Step 5 starts at 5.5 and hangs; a 30 s watchdog declares failure at 35.5; the attempt ends at 36.

    Attempt 0: init 1, steps 1-3 productive (3), stall 0.5, step 4 lost (restored step is 3),
    failure_detection 5.5-35.5 = 30, teardown 35.5-36 and the gap 36-40 restart_downtime (4.5). Attempt 1:
    init 1, restore 1, steps 4-5 productive.
    """
    a0 = _Attempt(0, 0.0, 0.0)
    a0.step(1, 1, 2).step(2, 2, 3).step(3, 3, 4).save(3, 4.0, 4.5, durable=5.0).step(4, 4.5, 5.5)
    a0.add("step_start", 5.5, step=5)
    a0.add("failure_detected", 35.5, reason="hang: no progress for 30s", silent_seconds=30.0)
    a0.add("attempt_end", 36.0, status="failed")
    a1 = _Attempt(1, 40.0, 41.0)
    a1.add("restore_start", 41.0).add("restore_end", 42.0, step=3).step(4, 42, 43).step(5, 43, 44)
    a1.add("attempt_end", 44.0, status="ok")
    acc = account(a0.events + a1.events)
    assert acc.categories == _approx(
        _expect(
            init=2.0,
            productive=5.0,
            checkpoint_stall=0.5,
            lost_work=1.0,
            failure_detection=30.0,
            restart_downtime=4.5,
            checkpoint_restore=1.0,
        )
    )
    assert acc.detect_seconds == pytest.approx(30.0)
    assert acc.attempts[0].failure_reason == "hang: no progress for 30s"


def test_running_attempt_counts_uncovered_steps_as_at_risk() -> None:
    a = _Attempt(0, 0.0, 0.0)
    a.step(1, 1, 2).save(1, 2, 2.5, durable=3).step(2, 2.5, 3.5).step(3, 3.5, 4.5)
    acc = account(a.events)
    assert acc.attempts[0].outcome == "running"
    assert acc.categories["productive"] == pytest.approx(3.0)
    assert acc.at_risk_seconds == pytest.approx(2.0)


def test_goodput_over_time_windows() -> None:
    """Init 0-2 then productive 2-10 (steps of 1 s): the 2 s window ending at 2 is 0, at 10 it is 1."""
    a = _Attempt(0, 0.0, 0.0)
    for i in range(8):
        a.step(i + 1, 2.0 + i, 3.0 + i)
    a.add("attempt_end", 10.0, status="ok")
    acc = account(a.events)
    series = goodput_over_time(acc, window=2.0, points=5)
    assert [t for t, _ in series] == pytest.approx([2.0, 4.0, 6.0, 8.0, 10.0])
    assert [g for _, g in series] == pytest.approx([0.0, 1.0, 1.0, 1.0, 1.0])


def test_empty_ledger_is_refused() -> None:
    with pytest.raises(ValueError, match="attempt_start"):
        account([])


_NAMES = st.sampled_from(
    [
        "step_start",
        "step_end",
        "checkpoint_stall_start",
        "checkpoint_stall_end",
        "checkpoint_durable",
        "restore_start",
        "restore_end",
        "failure_detected",
        "init_done",
        "eval",
        "attempt_end",
        "attempt_start",
        "checkpoint_stall",  # the checkpoint manager's spelling, with phase start or end
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(_NAMES, st.floats(0.0, 5.0), st.integers(0, 6), st.floats(0.0, 2.0), st.floats(0.0, 3.0)),
        max_size=40,
    )
)
def test_categories_tile_wall_time(raw: list[tuple[str, float, int, float, float]]) -> None:
    """Whatever the order, nesting or pairing of events, the categories are >= 0 and sum to wall time."""
    events: list[dict[str, Any]] = [
        {"event": "attempt_start", "wall": 0.0, "mono": 0.0, "process_start": 0.0}
    ]
    t = 0.0
    for name, dt, step, fetch, silent in raw:
        t += dt
        events.append(
            {
                "event": name,
                "wall": t + 3.0 * step,  # wall clock jumps; only attempt_start's wall anchors the axis
                "mono": t,
                "step": step,
                "fetch_seconds": fetch,
                "silent_seconds": silent,
                "process_start": t - silent,
                "phase": "start" if step % 2 else "end",
            }
        )
    acc = account(events)
    assert all(v >= 0.0 for v in acc.categories.values())
    assert sum(acc.categories.values()) == pytest.approx(acc.wall_seconds, abs=1e-9)
    assert 0.0 <= acc.goodput <= 1.0
    assert all(-1e-9 <= g <= 1.0 + 1e-9 for _, g in goodput_over_time(acc, window=1.0, points=20))


def test_manager_spelling_and_a_synchronous_commit_count_as_stall() -> None:
    """The checkpoint manager emits checkpoint_stall with phase start/end. A synchronous save commits after
    its stall event but before training resumes (no step between stall end 2.5 and durable 3.0), so the
    stall runs 2 -> 3 and nothing persists beside training (W = 0)."""
    a = _Attempt(0, 0.0, 0.0)
    a.step(1, 1, 2).add("checkpoint_stall", 2.0, phase="start", step=1)
    a.add("checkpoint_stall", 2.5, phase="end", step=1, seconds=0.5)
    a.add("checkpoint_durable", 3.0, step=1, stall_seconds=0.5, persist_seconds=1.0)
    a.step(2, 3, 4).add("attempt_end", 4.0, status="ok")
    acc = account(a.events)
    assert acc.categories == _approx(_expect(init=1.0, productive=2.0, checkpoint_stall=1.0))
    assert (acc.ckpt_stall_seconds, acc.persist_seconds) == (pytest.approx(1.0), pytest.approx(0.0))


def test_an_unclosed_exit_followed_by_a_restart_is_a_failure() -> None:
    """Attempt 0 exits without closing its ledger ("exited") after step 3, with step 2 durable (a 0.5 s
    synchronous save); attempt 1 restores step 2, so step 3 (1 s) was lost. Attempt 1 ends the same way,
    last: a clean end."""
    a0 = _Attempt(0, 0.0, 0.0)
    a0.step(1, 1, 2).step(2, 2, 3).save(2, 3.0, 3.5, durable=3.5).step(3, 3.5, 4.5)
    a0.add("attempt_end", 4.5, status="exited")
    a1 = _Attempt(1, 5.0, 5.0)
    a1.add("restore_start", 5.0).add("restore_end", 6.0, step=2).step(3, 6, 7)
    a1.add("attempt_end", 7.0, status="exited")
    acc = account(a0.events + a1.events)
    assert [a.outcome for a in acc.attempts] == ["failed", "ok"]
    assert acc.categories == _approx(
        _expect(
            init=1.0,
            productive=3.0,
            lost_work=1.0,
            checkpoint_stall=0.5,
            restart_downtime=0.5,
            checkpoint_restore=1.0,
        )
    )


def test_a_clean_attempt_whose_steps_are_redone_still_lost_them() -> None:
    """Attempt 0 ends "ok" after step 3 but its last checkpoint is step 2; attempt 1 restores step 2 and
    redoes step 3: that second of attempt 0 is lost work, though no failure happened."""
    a0 = _Attempt(0, 0.0, 0.0)
    a0.step(1, 1, 2).step(2, 2, 3).save(2, 3.0, 3.5, durable=4.0).step(3, 3.5, 4.5)
    a0.add("attempt_end", 4.5, status="ok")
    a1 = _Attempt(1, 4.5, 4.5)
    a1.add("restore_start", 4.5).add("restore_end", 5.5, step=2).step(3, 5.5, 6.5)
    a1.add("attempt_end", 6.5, status="ok")
    acc = account(a0.events + a1.events)
    assert acc.failures == 0 and acc.categories["lost_work"] == pytest.approx(1.0)


def test_a_final_save_tried_again_is_stall_until_it_commits() -> None:
    """Steps 1-2 (1-3, 1 s each) then the final save of step 2 at close: staged 3-3.5, its upload refused at 4,
    a pause 4-5 (``retry``), tried again 5-5.5 and committed at 6; attempt_end 6.5.

    No step ran after either try, so training was blocked from 3 to 6: stall 3, the pause included and counted as
    no save of its own; init 0.5, restore 0.5, productive 2, other 0.5 (6-6.5). Sum 6.5 = wall."""
    a = _Attempt(0, process_start=0.0, start=0.0)
    a.add("init_done", 0.5).add("restore_start", 0.5).add("restore_end", 1.0, step=None)
    a.step(1, 1.0, 2.0).step(2, 2.0, 3.0)
    a.save(2, 3.0, 3.5, durable=None).add("checkpoint_failed", 4.0, step=2, error="507 InsufficientStorage")
    a.add("checkpoint_stall", 4.0, phase="start", step=2, retry=1)
    a.add("checkpoint_stall", 5.0, phase="end", step=2, retry=1, seconds=1.0)
    a.save(2, 5.0, 5.5, durable=6.0)
    acc = account(a.add("attempt_end", 6.5, status="ok").events)
    assert acc.categories == _approx(
        _expect(init=0.5, checkpoint_restore=0.5, productive=2.0, checkpoint_stall=3.0, other=0.5)
    )
    assert [(s.step, s.durable) for s in acc.saves] == [(2, None), (2, pytest.approx(6.0))]
    assert acc.failures == 0


def test_a_rollback_between_two_saves_does_not_lengthen_the_interval() -> None:
    """A numeric rollback in the same process: attempt 1 begins, restores step 1 for 4 s (the save of step 2,
    still in flight when attempt 0 ended, becomes durable meanwhile and is recorded by attempt 1), then trains
    with a save after every step. The planner's interval is the compute between saves, 1 s (the steps the
    rollback discarded included: they were compute when they ran); the restore is the rollback's cost, which
    the planner charges to the failure, not time between saves."""
    a0 = _Attempt(0, 0.0, 0.0)
    a0.step(1, 1, 2).save(1, 2.0, 2.5, durable=2.6).step(2, 2.5, 3.5).save(2, 3.5, 4.0, durable=None).step(
        3, 4, 5
    )
    a0.add("numeric_fault", 5.0, kind="nonfinite", step=3).add("failure_detected", 5.0, reason="numeric")
    a0.add("attempt_end", 5.0, status="failed")
    a1 = _Attempt(1, 5.0, 5.0)
    a1.add("restore_start", 5.0).add("checkpoint_durable", 5.5, step=2).add("restore_end", 9.0, step=1)
    a1.add("rollback", 9.0, kind="nonfinite", tier="durable", from_step=3, to_step=1, seconds=4.0)
    a1.add("init_done", 9.0).step(2, 9, 10).save(2, 10.0, 10.5, durable=10.6).step(3, 10.5, 11.5)
    a1.save(3, 11.5, 12.0, durable=12.1).step(4, 12, 13).add("attempt_end", 13.0, status="ok")
    acc = account(a0.events + a1.events)
    assert acc.categories["rollback"] + acc.categories["checkpoint_restore"] == pytest.approx(4.0)
    assert acc.interval_seconds == pytest.approx(1.0)


def test_a_save_in_flight_at_a_rollback_stays_the_save_of_the_attempt_that_began_it() -> None:
    """The save of step 2 is begun in attempt 0 (stall 3.5-4.0) and still in flight when a NaN ends attempt 0
    in place; attempt 1 records its durable event at 5.5 with the persist time, 2 s, from the save's start. It is attempt 0's save, now durable, not an unstalled save of attempt 1."""
    a0 = _Attempt(0, 0.0, 0.0)
    a0.step(1, 1, 2).save(1, 2.0, 2.5, durable=2.6).step(2, 2.5, 3.5).save(2, 3.5, 4.0, durable=None)
    a0.step(3, 4, 5).add("numeric_fault", 5.0, kind="nonfinite", step=3)
    a0.add("failure_detected", 5.0, reason="numeric").add("attempt_end", 5.0, status="failed")
    a1 = _Attempt(1, 5.0, 5.0)
    a1.add("restore_start", 5.0).add("checkpoint_durable", 5.5, step=2, persist_seconds=2.0)
    a1.add("restore_end", 9.0, step=2).add("init_done", 9.0).step(3, 9, 10).save(3, 10.0, 10.5, durable=10.6)
    a1.step(4, 10.5, 11.5).add("attempt_end", 11.5, status="ok")
    saves = account(a0.events + a1.events).saves
    assert [(s.attempt, s.step) for s in saves] == [(0, 1), (0, 2), (1, 3)]
    assert saves[1].start == pytest.approx(3.5) and saves[1].durable == pytest.approx(5.5)
    assert saves[1].stall_seconds == pytest.approx(0.5)
