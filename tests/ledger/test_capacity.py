"""Capacity goodput, shrinks and grows: ledgers of a group of ranks written through the Ledger API.

Each scenario is a 30-second run of 1-second steps on a clock the test sets (tests/helpers/groups.py); the
expected figures are worked out from the scenario's own constants, not from the accounting's code.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from goodput.errors import ConfigError
from goodput.ledger import Ledger, read_events
from goodput.ledger.accounting import account
from goodput.ledger.report import build_report, load_report
from tests.helpers.groups import EPOCH, Clock, Group, set_clock

RESERVED = 3  # ranks the job reserved
BEFORE = 10  # 1-second steps at full size before the failure
DETECTED = 11.0  # the failure is noticed 1 s into step 11 (started at t = 10): 1 s of its work is lost
SHRINK = 1.0  # failure noticed -> training again on 2 ranks
SHORT = 10  # steps on 2 ranks
GROW = 1.0  # replacement ready -> training again on 3 ranks
AFTER = 7  # steps at full size after the grow
WALL = BEFORE + 1 + SHRINK + SHORT + GROW + AFTER  # 30 s
SHRUNK_AT = DETECTED + SHRINK  # 12: training resumes on the survivors
READY = SHRUNK_AT + SHORT  # 22: the replacement is ready
GROWN_AT = READY + GROW  # 23


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return set_clock(monkeypatch)


def _shrink_fields() -> dict[str, object]:
    return {
        "generation": 1,
        "step": BEFORE + 1,
        "world_before": RESERVED,
        "world_after": RESERVED - 1,
        "failed_ranks": [2],
        "seconds": SHRINK,
        "batch_rule": "grad_accum",
    }


def _grow_fields() -> dict[str, object]:
    step = BEFORE + 1 + SHORT
    return {"generation": 2, "step": step, "world_before": RESERVED - 1, "world_after": RESERVED, "joined": 1,
            "seconds": GROW}  # fmt: skip


def _shrink_in_place(run_dir: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 2 dies during step 11; ranks 0 and 1 go on in the same attempt, and a newcomer joins later."""
    group = Group(run_dir, clock, [0, 1, 2], monkeypatch=monkeypatch)
    step = group.steps(1, BEFORE)
    group.start_step(step)
    clock.t = BEFORE + 0.5
    group.lose(2)
    clock.t = SHRUNK_AT
    group.event("shrink", **_shrink_fields())
    step = group.steps(step, SHORT)
    clock.t = GROWN_AT
    group.event("grow", **_grow_fields())
    group.steps(step, AFTER)
    group.close()


def _expected_capacity() -> float:
    productive_rank_seconds = RESERVED * BEFORE + (RESERVED - 1) * SHORT + RESERVED * AFTER
    return productive_rank_seconds / (RESERVED * WALL)


def test_a_shrink_in_place_and_a_grow(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    _shrink_in_place(tmp_path, clock, monkeypatch)
    acc = account(read_events(tmp_path, rank=None))
    assert acc.wall_seconds == pytest.approx(WALL)
    assert acc.categories["productive"] == pytest.approx(BEFORE + SHORT + AFTER)
    assert acc.categories["lost_work"] == pytest.approx(DETECTED - BEFORE)
    assert acc.categories["reshape"] == pytest.approx(SHRINK + GROW)
    assert acc.goodput == pytest.approx((BEFORE + SHORT + AFTER) / WALL)
    assert acc.capacity_goodput == pytest.approx(_expected_capacity())
    assert (acc.failures, acc.restarts) == (1, 0)  # a shrink is a failure, and no restart
    assert [(r.kind, r.world_before, r.world_after, r.step) for r in acc.reshapes] == [
        ("shrink", RESERVED, RESERVED - 1, BEFORE + 1),
        ("grow", RESERVED - 1, RESERVED, BEFORE + 1 + SHORT),
    ]  # ranks 0 and 1 both recorded each one: counted once
    assert [(w.start, w.end, w.world) for w in acc.world] == [
        pytest.approx((0.0, SHRUNK_AT, RESERVED)),
        pytest.approx((SHRUNK_AT, GROWN_AT, RESERVED - 1)),
        pytest.approx((GROWN_AT, WALL, RESERVED)),
    ]
    assert acc.capacity is not None
    assert acc.capacity.reduced_seconds == pytest.approx(GROWN_AT - SHRUNK_AT)
    assert acc.capacity.regrow_seconds == pytest.approx(READY - DETECTED)
    assert acc.capacity.reduced_per_shrink == pytest.approx(READY - SHRUNK_AT)


def test_a_shrink_and_a_grow_that_each_open_an_attempt(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the warm agent does it: the survivors close the failed generation's attempt and open the next on 2
    ranks (recording warm_restart, then the shrink when their state is back, before the wrappers and loader
    are rebuilt); for the grow, the agent ends that generation at a step boundary (the survivors leave with
    step 21 begun) and all three open the next. The reshape time runs to the next step's start, and neither
    the shrink's attempt nor the grow's is a restart, nor the grow a failure."""
    group = Group(tmp_path, clock, [0, 1, 2], reserved=RESERVED, monkeypatch=monkeypatch)
    step = group.steps(1, BEFORE)
    group.start_step(step)
    clock.t = BEFORE + 0.5
    group.lose(2)
    clock.t = DETECTED
    group.fail("peer failure: rank 2")
    clock.t = DETECTED + 0.2
    survivors = Group(tmp_path, clock, [0, 1], attempt=1, reserved=RESERVED, monkeypatch=monkeypatch)
    clock.t = DETECTED + 0.6
    survivors.event("warm_restart", generation=1, role="survivor", restored_step=BEFORE)
    survivors.event("shrink", **{**_shrink_fields(), "seconds": clock.t - DETECTED})
    clock.t = SHRUNK_AT
    step = survivors.steps(step, SHORT)
    survivors.start_step(step)
    clock.t = READY + 0.2
    survivors.fail(f"peer failure: generation 1 ended: leaving before step {step}")
    clock.t = READY + 0.3
    grown = Group(tmp_path, clock, [0, 1, 2], attempt=2, reserved=RESERVED, monkeypatch=monkeypatch)
    clock.t = READY + 0.8
    grown.event("warm_restart", generation=2, role="survivor", restored_step=step - 1)
    grown.event("grow", **{**_grow_fields(), "seconds": clock.t - READY})
    clock.t = GROWN_AT
    grown.steps(step, AFTER)
    grown.close()
    report = load_report(tmp_path)
    acc = report.accounting
    assert acc.categories["reshape"] == pytest.approx(SHRINK + GROW)
    assert acc.categories["lost_work"] == pytest.approx(DETECTED - BEFORE)
    assert acc.categories["productive"] == pytest.approx(BEFORE + SHORT + AFTER)
    assert acc.capacity_goodput == pytest.approx(_expected_capacity())
    assert (acc.failures, acc.restarts) == (1, 0)
    assert [a.outcome for a in acc.attempts] == ["failed", "resized", "ok"]
    assert [r.seconds for r in acc.reshapes] == [pytest.approx(SHRINK), pytest.approx(GROW)]
    assert "restarts: " not in report.render()  # the warm_restart events of a shrink and a grow: no restart


def test_fewer_ranks_than_reserved(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Started on 2 of the 4 ranks it reserved (GOODPUT_RESERVED_WORLD=4): half the capacity of its time."""
    group = Group(tmp_path, clock, [0, 1], reserved=4, monkeypatch=monkeypatch)
    group.steps(1, 10)
    group.close()
    events = read_events(tmp_path, rank=None)
    assert {e["reserved_world"] for e in events if e["event"] == "attempt_start"} == {4}
    acc = account(events)
    assert acc.goodput == pytest.approx(1.0)
    assert acc.capacity_goodput == pytest.approx(2 / 4)


def test_a_run_at_its_reserved_size_has_capacity_goodput_equal_to_goodput(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = Group(tmp_path, clock, [0, 1], monkeypatch=monkeypatch)
    group.steps(1, 5)
    clock.t += 5.0  # idle: not productive
    group.close()
    acc = account(read_events(tmp_path, rank=None))
    assert acc.goodput == pytest.approx(0.5)
    assert acc.capacity_goodput == pytest.approx(acc.goodput)
    assert acc.reshapes == () and acc.capacity is not None and acc.capacity.reduced_seconds == 0.0


def test_a_bad_reserved_world_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODPUT_RESERVED_WORLD", "eight")
    with pytest.raises(ConfigError, match="GOODPUT_RESERVED_WORLD='eight' must be a whole number"):
        Ledger(tmp_path)


def test_live_capacity_goodput_follows_the_world_size(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10 s on 3 of 3 ranks, then 10 s on 2: live goodput 1, live capacity goodput (30 + 20) / (3 x 20)."""
    group = Group(tmp_path, clock, [0], world=RESERVED, reserved=RESERVED, monkeypatch=monkeypatch)
    step = group.steps(1, 10)
    group.event("shrink", **{**_shrink_fields(), "seconds": 0.0})
    group.steps(step, 10)
    ledger = group.ledgers[0]
    assert ledger.live_goodput == pytest.approx(1.0)
    assert ledger.live_capacity_goodput == pytest.approx((10 * 3 + 10 * 2) / (3 * 20))
    group.close()


def test_an_attempt_that_goes_on_in_the_same_process_carries_its_live_goodput(
    tmp_path: Path, clock: Clock
) -> None:
    """10 s of steps, a rollback (or a warm restart's re-forming) of 1 s, then a 0.1 s step in the same process:
    live goodput is the process's (10 + 0.1) / 11.1, not that of the new attempt's first step alone."""
    first = Ledger(tmp_path, rank=0, attempt=0, began=clock.time())
    for step in range(1, 11):
        first.step_start(step)
        clock.t += 1.0
        first.step_end(step)
    first.close("failed")
    clock.t += 1.0
    second = Ledger(tmp_path, rank=0, attempt=1, began=clock.time())
    second.carry_live(first.live_totals())
    second.step_start(11)
    clock.t += 0.1
    second.step_end(11)
    assert second.live_goodput == pytest.approx(10.1 / 11.1)
    second.close()
    starts = [e["process_start"] for e in read_events(tmp_path) if e["event"] == "attempt_start"]
    assert starts == [EPOCH, EPOCH + 11.0]  # what each attempt records is its own begin, as before


def test_a_run_s_rollback_attempt_starts_from_the_process_s_live_goodput(tmp_path: Path) -> None:
    import torch

    import goodput as gp

    run = gp.Run(str(tmp_path), total_steps=8, hang_timeout=None, progress=False)
    loader = gp.ResumableLoader(torch.utils.data.TensorDataset(torch.ones(8, 1)), batch_size=2, seed=0)
    run.restore(model=torch.nn.Linear(1, 1), loader=loader)
    for _ in zip(range(3), run.batches(loader), strict=False):
        run.step_done(loss=1.0)
    assert run.ledger.live_goodput > 0
    run.end_attempt("a rollback")
    run.begin_attempt("rollback", began=time.time())
    assert run.ledger.attempt == 1 and run.ledger.live_goodput > 0  # no step of its own yet: the process's
    run.close()


def test_the_report_shows_capacity_and_each_reshape(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shrink_in_place(tmp_path, clock, monkeypatch)
    report = load_report(tmp_path)
    text = report.render()
    assert f"capacity goodput (measured) {100 * _expected_capacity():.1f}%" in text
    assert "1 answered by shrinking in place" in text
    assert (
        f"shrink 3->2 at {SHRUNK_AT:g}s, step {BEFORE + 1}: 1s (ranks [2] lost, batch kept by grad_accum)"
        in text
    )
    assert f"grow 2->3 at {GROWN_AT:g}s, step {BEFORE + 1 + SHORT}: 1s (1 joined)" in text
    out = json.loads(json.dumps(report.to_dict()))
    assert out["capacity_goodput"] == pytest.approx(_expected_capacity())
    assert [r["kind"] for r in out["reshapes"]] == ["shrink", "grow"]
    assert out["categories"]["reshape"] == pytest.approx(SHRINK + GROW)
    assert out["world"][1][2] == RESERVED - 1


def test_the_prediction_learns_the_shrink_costs(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One failure in 30 s answered by a shrink: the model charges D + S + G + L = 0 + 1 + 1 + 1 s of badput,
    which is exactly this run's (no checkpoints: nothing else to model), and 10 s of 30 short of one of 3
    ranks; it expects a random failure's short time to fall on training as often as the run's time does (90%),
    where this one's fell on training throughout: 1.1 points apart."""
    _shrink_in_place(tmp_path, clock, monkeypatch)
    report = build_report(read_events(tmp_path, rank=None))
    pred = report.prediction
    assert pred.shrink is not None
    assert pred.shrink["regrow"] == pytest.approx(READY - DETECTED)
    assert pred.predicted_goodput == pytest.approx(1 - (SHRINK + GROW + (DETECTED - BEFORE)) / WALL)
    short = (READY - SHRUNK_AT) / WALL
    assert pred.predicted_capacity_goodput == pytest.approx(pred.predicted_goodput * (1 - short / RESERVED))
    assert abs(pred.predicted_capacity_goodput - _expected_capacity()) < 0.02
    assert not [a for a in report.advice if a.kind in ("no_checkpoint", "restart")]  # nothing was thrown away


def _world_pixels(png: Path) -> int:
    import matplotlib.image

    from goodput.ledger.plot import WORLD_COLOUR

    pixels = matplotlib.image.imread(str(png))[:, :, :3]
    rgb = [int(WORLD_COLOUR[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    near = (abs(pixels[:, :, 0] - rgb[0]) < 0.08) & (abs(pixels[:, :, 1] - rgb[1]) < 0.08)
    return int((near & (abs(pixels[:, :, 2] - rgb[2]) < 0.08)).sum())


def test_the_plot_draws_the_world_size_of_a_run_that_shrank(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from goodput.ledger.plot import plot_report

    shrank, steady = tmp_path / "shrank", tmp_path / "steady"
    _shrink_in_place(shrank, clock, monkeypatch)
    clock.t = 0.0
    group = Group(steady, clock, [0, 1], monkeypatch=monkeypatch)
    group.steps(1, 30)
    group.close()
    for run in (shrank, steady):
        plot_report(load_report(run), str(run / "timeline.png"))
    assert _world_pixels(shrank / "timeline.png") > 500  # the world size line and its axis label
    assert _world_pixels(steady / "timeline.png") == 0  # at its reserved size throughout: no second axis
