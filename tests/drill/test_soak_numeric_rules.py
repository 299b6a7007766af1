"""The soak and the numeric guard's own limits: a schedule leaves the guard room to answer every numeric fault
(it stops a run whose rollbacks come too close, exit 65), and a spike that came while the rule warmed up after a
relaunch is counted as not detectable, not as a fault the guard failed to answer."""

from __future__ import annotations

from goodput.drill.soak_checks import WARMING_UP, kind_rows, undetectable_spikes
from goodput.drill.soak_plan import NUMERIC, Checks, SoakFault, draw_schedule
from goodput.drill.soak_report import _count_problems


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
