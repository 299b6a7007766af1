"""The soak and the numeric guard's own limits: a schedule leaves the guard room to answer every numeric fault
(it stops a run whose rollbacks come too close, exit 65), and a spike that came while the rule warmed up after a
relaunch is counted as not detectable, not as a fault the guard failed to answer."""

from __future__ import annotations

from goodput.drill.soak_checks import kind_rows
from goodput.drill.soak_plan import NUMERIC, Checks, SoakFault, draw_schedule
from goodput.drill.soak_report import _count_problems
from goodput.verify.rollback import WARMING_UP, undetectable_spikes


def _numeric_steps(rollbacks: tuple[int, int] | None) -> list[int]:
    schedule = draw_schedule(
        seed=5, mtbf=2, seconds=600, step_seconds=0.1, steps=6_000, first_step=30, world=2,
        kinds=("nan", "spike", "bitflip", "kill"), checks=Checks(every=50, first=100), rollbacks=rollbacks,
    )  # fmt: skip
    return [f.step for f in schedule if f.kind in NUMERIC]


def test_no_window_of_the_guard_s_rollback_budget_holds_more_numeric_faults_than_it_answers() -> None:
    crowded = _numeric_steps(None)  # ~225 numeric faults over 6,000 steps: ~37 in any 1,000
    assert max(sum(1 for t in crowded if s <= t < s + 1000) for s in crowded) > 2
    for most, window in ((3, 1000), (1, 400)):
        steps = _numeric_steps((most, window))
        assert len(steps) >= 6_000 // window - 1, steps  # thinned, not emptied
        # the guard stops at a fault with max_rollbacks rollbacks in the window before it: at most
        # max_rollbacks - 1 (1, if that is 1) injected in any window, a rollback of its own still allowed
        room = max(most - 1, 1)
        assert max(sum(1 for t in steps if s <= t < s + window) for s in steps) <= room, (most, steps)


def test_a_spike_in_the_rule_s_warm_up_after_a_relaunch_is_not_detectable_and_one_the_rule_missed_is_a_fault() -> (
    None
):
    spikes = [SoakFault(kind="spike", seconds=s, step=100 * s, rank=None) for s in (1, 2)]

    def missed(step: int, why: str) -> dict:
        return {"event": "spike_missed", "step": step, "factor": 50.0, "why": why}

    warming = missed(100, f"{WARMING_UP} (2 of spike_warmup=20 steps)")
    off = missed(200, "the spike rule is off (NumericConfig(spike_k=None))")
    assert undetectable_spikes([warming, off]) == {100: None}
    rows = kind_rows(spikes, [], [warming, off], {})
    assert next(r for r in rows if r.kind == "spike").undetectable == (None,)
    assert _count_problems(rows) == ["spike: 2 scheduled, 0 seen (1 not detectable)"]


def test_the_soak_reads_the_warm_up_reason_the_guard_writes() -> None:
    from goodput.run.numeric.spikes import WARMING_UP as WRITTEN

    assert WRITTEN == WARMING_UP


def test_the_restart_that_hands_a_rank_named_corrupt_to_a_spare_is_the_bit_flip_s_answer_not_a_kill() -> None:
    from goodput.ledger.accounting import AttemptSummary

    def attempt(number: int, began: str) -> AttemptSummary:
        return AttemptSummary(
            number=number, start=float(number), end=number + 1.0, outcome="failed", steps=10, first_step=None,
            last_step=None, restored_step=None, failure_reason=None, categories={}, began=began,
        )  # fmt: skip

    schedule = [SoakFault(kind="bitflip", seconds=1, step=474, rank=1)]
    # attempt 0 names rank 1 by majority (its verdict, then the rollback opens attempt 1); rank 1 leaves for a
    # hot spare, whose restart opens attempt 2; a later restart (attempt 3) is a failure of its own
    events = [{"event": "sdc_handover", "attempt": 0, "rank": 0, "named_rank": 1, "step": 476}]
    attempts = [attempt(0, "start"), attempt(1, "rollback"), attempt(2, "restart"), attempt(3, "restart")]
    rollback = {"event": "rollback", "attempt": 1, "kind": "sdc", "seconds_total": 0.1}
    rows = {r.kind: r for r in kind_rows(schedule, attempts, [*events, rollback], {})}
    assert (rows["bitflip"].seen, rows["kill"].seen) == (1, 1), rows
    assert _count_problems(list(rows.values())) == ["kill: 0 scheduled, 1 seen"]


def test_a_lineage_is_compared_with_the_reference_up_to_the_first_window_the_guard_skipped() -> None:
    from goodput.drill.soak_checks import first_skipped, until
    from goodput.verify.compare import compare_records
    from goodput.verify.records import RunRecords, StepRecord

    def records(ids: list[int], final: str) -> RunRecords:
        steps = {
            0: {
                s: StepRecord(step=s, rank=0, attempt=0, resumed=0, samples=str(i), count=1, loss="0", rng={}, ids=(i,))
                for s, i in enumerate(ids, 1)
            }
        }  # fmt: skip
        return RunRecords(steps=steps, final={0: {"step": len(ids), "state": {"model": final}}}, attempts=[0])

    reference = records([5, 1, 4, 2, 0, 3], "a")
    skipped = records([5, 1, 2, 0, 3, 4], "b")  # steps 3 and on: the data after the window the guard skipped
    cut = first_skipped([{"event": "skip", "first_step": 3, "last_step": 3}, {"event": "step_done"}])
    assert cut == 3 and first_skipped([{"event": "step_done"}]) is None
    assert compare_records(reference, skipped)  # whole: they differ
    assert not compare_records(until(reference, cut), until(skipped, cut))  # before the window: the same
    assert compare_records(
        until(reference, cut), until(records([5, 0, 4, 2, 1, 3], "a"), cut)
    )  # step 2 differs
    assert until(reference, None) is reference


def test_a_missed_spike_is_judged_by_the_loss_the_rule_saw_against_its_threshold() -> None:
    """A 50x spike on a step whose own loss sits under half the loss's level stays under the threshold although
    the rule needs less than half the factor (a rise of 24.66x): only the judged loss against the threshold says
    whether the rule could see it, both ways."""
    spikes = [SoakFault(kind="spike", seconds=s, step=100 * s, rank=None) for s in (1, 2)]

    def missed(step: int, loss: float) -> dict:
        return {"event": "spike_missed", "step": step, "factor": 50.0, "rise": 24.66, "threshold": 7.86,
                "loss": loss}  # fmt: skip

    under, over = missed(100, 7.7), missed(200, 7.9)
    assert undetectable_spikes([under, over]) == {100: 24.66}
    rows = kind_rows(spikes, [], [under, over], {})
    assert _count_problems(rows) == ["spike: 2 scheduled, 0 seen (1 not detectable)"]
    assert _count_problems(kind_rows(spikes, [], [under, missed(200, 7.86)], {})) == []


def test_the_guard_s_missed_spike_names_the_loss_it_judged_and_the_threshold() -> None:
    import random

    from goodput.run.numeric import NumericConfig
    from goodput.run.numeric.rules import spike_threshold
    from goodput.run.numeric.spikes import SpikeWatch

    class Ledger:
        def __init__(self) -> None:
            self.events: list[dict] = []

        def event(self, name: str, **fields: object) -> None:
            self.events.append({"event": name, **fields})

    class Run:
        ledger = Ledger()

    rng = random.Random(3)
    history = [1.0 * rng.lognormvariate(0.0, 0.6) for _ in range(100)]
    threshold = spike_threshold(history, k=6.0, min_rise=0.1)
    low = threshold / 50 * 0.9  # a step whose own loss, times 50, stays under the threshold
    watch = SpikeWatch(NumericConfig())
    watch.injected(133, 50.0)
    watch.judged(Run(), 133, history, False, 50 * low)
    (event,) = [e for e in Run.ledger.events if e["event"] == "spike_missed"]
    assert event["loss"] == 50 * low and event["threshold"] == threshold
    assert undetectable_spikes([event]) == {133: event["rise"]}
    assert (
        f"took the loss to {50 * low:.4g}, not above the spike rule's threshold {threshold:.4g}"
        in event["why"]
    )


def test_the_spike_scenario_calls_a_spike_under_the_threshold_not_detectable_and_a_missed_one_over_it_a_failure() -> (
    None
):
    from goodput.drill.numeric import _hidden_spike

    def missed(loss: float) -> dict:
        return {"event": "spike_missed", "step": 60, "factor": 50.0, "rise": 24.66, "threshold": 7.86,
                "loss": loss, "why": "a 50x spike took the loss to ..."}  # fmt: skip

    assert _hidden_spike([missed(7.7), missed(7.7)], 0).startswith("not detectable on this loss: a 50x spike")
    assert _hidden_spike([missed(7.9)], 0) == ""  # the guard saw a loss over its threshold and let it pass
    assert _hidden_spike([missed(7.7)], 1) == ""  # rolled back after all: judged as any run
    assert _hidden_spike([], 0) == ""
