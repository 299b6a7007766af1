"""The soak's pure parts: the schedule drawn from a seed, the leak rule over a process's readings, and the
lineage's exactly-once check, each on inputs made to break it; and the limit a soak's launches wait under."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import sys
from pathlib import Path

import pytest

from goodput.drill import soak_plan
from goodput.drill.soak_checks import lineage_problems
from goodput.drill.soak_leaks import Sample, leaks
from goodput.drill.soak_plan import KINDS, SENT, SENT_LAG_SECONDS, STORE, SoakFault, SoakPlan
from goodput.drill.soak_store import StoreWindow, store_problems, store_rows, writes
from goodput.errors import ConfigError
from goodput.faults import parse_faults
from goodput.ledger.accounting import AttemptSummary
from goodput.verify.records import RunRecords, StepRecord

_CHECKS = soak_plan.Checks(every=50, first=100)


def _draw(seed: int, kinds: tuple[str, ...] = KINDS, mtbf: float = 10) -> tuple:
    return soak_plan.draw_schedule(
        seed=seed, mtbf=mtbf, seconds=600, step_seconds=0.01, steps=60_000, first_step=30, world=2, kinds=kinds,
        checks=_CHECKS,
    )  # fmt: skip


def test_a_seed_draws_one_schedule_of_every_kind_at_distinct_steps_with_the_mean_gap() -> None:
    schedule = _draw(7)
    assert schedule == _draw(7) and schedule != _draw(8)
    assert {f.kind for f in schedule} == set(KINDS)
    steps = [f.step for f in schedule]
    assert steps == sorted(set(steps)) and steps[0] >= 30
    gaps = [b.seconds - a.seconds for a, b in itertools.pairwise(schedule)]
    assert 7 < sum(gaps) / len(gaps) < 14, gaps  # exponential gaps of mean 10 s, ~60 of them, a few left out
    # the in-process faults as one plan goodput.faults accepts
    plan = parse_faults(soak_plan.fault_plan(schedule))
    assert len(plan) == sum(1 for f in schedule if f.kind not in SENT and f.kind not in STORE)
    assert {f.kind for f in schedule if f.rank is not None} == {"kill", "hang", "nan", "slow", "bitflip"}


def test_a_bit_flip_falls_between_two_checks_with_no_other_fault_until_the_check_after_it() -> None:
    schedule = _draw(3, mtbf=2)  # crowded: ~300 faults in 600 s, so windows are contested
    flips = [f for f in schedule if f.kind == "bitflip"]
    assert len(flips) >= 10
    lag = SENT_LAG_SECONDS / 0.01
    for flip in flips:
        assert flip.step % _CHECKS.every == _CHECKS.every // 2 and flip.step > _CHECKS.first
        before = flip.step - _CHECKS.every // 2  # the last check that agreed: the rollback's target
        for other in schedule:
            if other is flip:
                continue
            last = other.step + (
                lag if other.kind in SENT else 2
            )  # a sent fault lands late, a verdict a step late
            assert last < before - 2 or other.step > before + _CHECKS.every + 2, (flip, other)


def test_a_schedule_without_the_new_kinds_is_the_one_the_same_seed_drew_before_them() -> None:
    # a soak limited to --kinds kill,nan,spike,slow,preempt draws what those five drew alone: replay files and
    # the CI soak's seed keep their schedule
    old = ("kill", "nan", "spike", "slow", "preempt")
    draw, expected = random.Random(1), []
    at = draw.expovariate(1 / 5)
    while (
        at < 600
    ):  # the draw as the soak's docs state it: exponential gaps, a kind, a rank for one-rank kinds
        kind = draw.choice(old)
        expected.append((kind, draw.randrange(2) if kind in ("kill", "nan", "slow") else None))
        at += draw.expovariate(1 / 5)
    assert [(f.kind, f.rank) for f in _draw(1, kinds=old, mtbf=5)] == expected


def test_bit_flips_without_replica_checks_are_refused() -> None:
    with pytest.raises(ConfigError, match="check_every"):
        soak_plan.draw_schedule(
            seed=1, mtbf=10, seconds=60, step_seconds=0.01, steps=6000, first_step=30, world=2, checks=None
        )


def _series(values: list[int], *, metric: str = "fds") -> list[Sample]:
    return [Sample(float(t), 42, "worker", **{metric: v}) for t, v in enumerate(values)]  # type: ignore[arg-type]


def test_a_count_that_keeps_growing_leaks_and_one_that_rose_once_does_not() -> None:
    growing = _series(list(range(10, 70)))
    assert leaks(growing, warmup=10, now=59) and "fds kept growing" in leaks(growing, warmup=10, now=59)[0]
    assert not leaks(growing, warmup=10, now=39)  # too young to judge
    assert leaks(growing, warmup=10, now=40)  # judged once it has lived four warm-ups, as the docs say
    # an agent's open files as a two-node soak read them under load: a start-up longer than its warm-up, a rank
    # killed at 17 s and its spare replaced (27 -> 33), the readings a second apart from 1 s: one rise after the
    # base, no leak whenever it is judged (each window a whole warm-up, never a few readings)
    fds = [3, 3, 16, 16, *[21] * 7, 29, 31, 31, 31, 31, 29, 27, 27, 28, 32, *[33] * 10, *[23] * 25]
    agent = [Sample(1.0 + 1.01 * t, 7918, "agent", fds=n, threads=5) for t, n in enumerate(fds)]
    assert not any(leaks(agent[: t + 1], warmup=10, now=s.seconds) for t, s in enumerate(agent))
    once = _series([4] * 30 + [36] * 30)  # a hot spare that took a rank
    assert not leaks(once, warmup=10, now=59)
    # a hot spare waits with one thread, then takes a rank: its start-up under load spans two warm-ups
    waited = [Sample(float(t), 7, "worker", fds=4, threads=1) for t in range(20)]
    waited += [
        Sample(float(t), 7, "worker", fds=17 if t < 30 else 36, threads=10 if t < 30 else 20)
        for t in range(20, 80)
    ]
    assert not any(leaks(waited[: now + 1], warmup=10, now=now) for now in range(80))
    busy = [
        dataclasses.replace(s, threads=max(s.threads, 2)) for s in waited
    ]  # the same rises, never waiting
    assert any(leaks(busy[: now + 1], warmup=10, now=now) for now in range(80))


def test_resident_memory_leaks_only_past_five_percent_of_steady_growth() -> None:
    slow = _series([1000 + t for t in range(60)], metric="rss_mib")  # +4% from the warm-up's highest
    assert not leaks(slow, warmup=10, now=59)
    fast = _series([1000 + 5 * t for t in range(60)], metric="rss_mib")
    assert "resident memory kept growing" in leaks(fast, warmup=10, now=59)[0]
    # a hot spare that took a rank inside the middle window, then settled in over a few MiB: no leak
    took = [Sample(float(t), 42, "worker", rss_mib=241.0 if t < 30 else 241.3) for t in range(45)]
    took += [Sample(float(t), 42, "worker", rss_mib=274 + (t - 45) / 4) for t in range(45, 60)]
    assert not leaks(took, warmup=10, now=59)


def _records(ids_by_step: dict[int, list[list[int]]]) -> RunRecords:
    steps: dict[int, dict[int, StepRecord]] = {}
    for step, per_rank in ids_by_step.items():
        for rank, ids in enumerate(per_rank):
            steps.setdefault(rank, {})[step] = StepRecord(
                step=step, rank=rank, attempt=0, resumed=0, samples="", count=len(ids), loss="0", rng={},
                world=len(per_rank), ids=tuple(ids),
            )  # fmt: skip
    return RunRecords(steps=steps, final={}, attempts=[0])


def _epochs(n: int) -> dict[int, list[list[int]]]:
    """``n`` epochs of 8 samples, 2 ranks x 1 sample a step, in a different order each epoch."""
    out: dict[int, list[list[int]]] = {}
    for epoch in range(n):
        order = [(i * (2 * epoch + 3)) % 8 for i in range(8)]
        for k in range(4):
            out[epoch * 4 + k + 1] = [[order[2 * k]], [order[2 * k + 1]]]
    return out


def test_the_lineage_check_finds_a_missing_step_a_repeated_sample_and_allows_a_skipped_window() -> None:
    steps = _epochs(3)
    assert lineage_problems(_records(steps), 12) == []
    missing = {s: ids for s, ids in steps.items() if s != 6}
    assert "1 step(s) missing" in lineage_problems(_records(missing), 12)[0]
    repeated = {**steps, 3: steps[2]}  # step 3 trains step 2's samples again
    assert "trained twice within an epoch" in lineage_problems(_records(repeated), 12)[0]
    # the guard skipped step 6's data: epoch 1 is one step shorter, and the steps after it move up one
    skipped = {s if s < 6 else s - 1: ids for s, ids in steps.items() if s != 6}
    assert lineage_problems(_records(skipped), 11, skipped_steps=1) == []
    assert lineage_problems(_records(skipped), 11, skipped_steps=0)  # the same, unexplained: a repeat


def test_a_missed_spike_is_a_violation_unless_the_rule_s_own_figure_said_it_could_not_be_seen() -> None:
    from goodput.drill.soak_checks import kind_rows
    from goodput.drill.soak_plan import SoakFault
    from goodput.drill.soak_report import _count_problems

    spikes = [SoakFault(kind="spike", seconds=s, step=100 * s, rank=None) for s in (1, 2)]

    def missed(step: int, rise: float) -> dict:
        return {"event": "spike_missed", "step": step, "factor": 50.0, "rise": rise, "threshold": 1.0}

    # the rule needed 700x at step 100 (undetectable) but only 20x at step 200, under half the spike's 50x: that
    # miss is the rule's fault
    rows = kind_rows(spikes, [], [missed(100, 700.0), missed(200, 20.0)], {})
    spike = next(r for r in rows if r.kind == "spike")
    assert spike.seen == 0 and spike.undetectable == (700.0,)
    assert _count_problems(rows) == ["spike: 2 scheduled, 0 seen (1 not detectable)"]
    both = kind_rows(spikes, [], [missed(100, 700.0), missed(100, 700.0), missed(200, 26.0)], {})
    assert next(r for r in both if r.kind == "spike").undetectable == (700.0, 26.0)  # once per step
    assert _count_problems(both) == []


def _attempt(number: int, began: str) -> AttemptSummary:
    return AttemptSummary(
        number=number, start=float(number), end=number + 1.0, outcome="failed", steps=10, first_step=None,
        last_step=None, restored_step=None, failure_reason=None, categories={"failure_detection": 1.0},
        began=began,
    )  # fmt: skip


def test_a_restart_after_a_hang_that_a_peer_saw_as_its_failure_is_counted_as_the_hang() -> None:
    from goodput.drill.soak_checks import hung_attempts, kind_rows
    from goodput.drill.soak_plan import SoakFault

    schedule = [
        SoakFault(kind="hang", seconds=1, step=10, rank=1),
        SoakFault(kind="kill", seconds=2, step=20, rank=0),
    ]
    events = [  # attempt 0: rank 1 hung, rank 0 first saw its peer go; attempt 1: a kill, nobody declared a hang
        {"event": "failure_detected", "attempt": 0, "rank": 0, "reason": "peer failure: connection closed"},
        {"event": "failure_detected", "attempt": 0, "rank": 1, "reason": "hang"},
        {"event": "failure_detected", "attempt": 1, "rank": 1, "reason": "peer failure: connection closed"},
    ]
    attempts = [_attempt(0, "start"), _attempt(1, "restart"), _attempt(2, "restart")]
    assert hung_attempts(events) == {0}
    rows = {r.kind: r for r in kind_rows(schedule, attempts, [], {}, (), hung_attempts(events))}
    assert (rows["hang"].seen, rows["kill"].seen) == (1, 1)


def test_only_the_loss_of_an_unseen_spike_s_step_is_taken_from_the_reference() -> None:
    from goodput.drill.soak_checks import as_reference_at
    from goodput.verify.compare import compare_records

    reference = _records(_epochs(1))

    def changed(step: int, **fields: str) -> RunRecords:
        steps = {
            rank: {s: dataclasses.replace(r, **fields) if s == step else r for s, r in by_step.items()}
            for rank, by_step in reference.steps.items()
        }
        return dataclasses.replace(reference, steps=steps)

    spiked = changed(2, loss="50")  # the loss reported at step 2, x50
    assert compare_records(reference, spiked)
    assert not compare_records(reference, as_reference_at(spiked, reference, {2}))
    assert compare_records(reference, as_reference_at(changed(3, loss="50"), reference, {2}))  # not step 2's
    assert compare_records(
        reference, as_reference_at(changed(2, samples="other"), reference, {2})
    )  # its data


def test_a_cache_reading_over_its_budget_is_a_violation_and_one_at_or_under_it_is_not() -> None:
    from goodput.drill.soak_cache import CacheSample, over_budget
    from goodput.drill.soak_report import cache_text

    budget = 8 << 20
    readings = [
        CacheSample(float(t), "/c", held, budget) for t, held in enumerate((0, 3 << 20, budget, 5 << 20))
    ]
    assert not any(over_budget(r) for r in readings)  # a cache exactly full is within its budget
    over = CacheSample(4.0, "/c", budget + 1, budget)
    assert over_budget(over) == (
        f"the data cache /c held {budget + 1} bytes at 4.0s, over its budget of {budget} bytes"
    )
    assert cache_text(readings) == "data cache /c: 0.0 -> max 8.0 -> 5.0 MiB of its 8.0 MiB budget"
    assert "none declared" in cache_text([])  # a job without a cache: said so, nothing checked


def test_store_faults_join_no_fault_plan_and_a_replay_file_keeps_them(tmp_path: Path) -> None:
    schedule = (
        SoakFault(kind="full", seconds=1.0, step=40),
        SoakFault(kind="kill", seconds=1.5, step=45, rank=1),
        SoakFault(kind="throttled", seconds=3.0, step=90),
    )
    # the store's faults are the soak's own windows
    assert soak_plan.fault_plan(schedule) == "kill@step=45,rank=1"
    assert "507" in schedule[0].text() and "SlowDown" in schedule[2].text()
    assert all(f.rank is None for f in _draw(7) if f.kind in STORE)
    plan = SoakPlan(seed=1, mtbf=5.0, seconds=2.0, steps=200, step_seconds=0.01, schedule=schedule)
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(plan.to_json("a violation")))
    assert soak_plan.read_replay(str(path)) == plan


def test_a_full_store_refuses_uploads_and_multipart_writes_but_serves_reads_and_deletes() -> None:
    refused = [
        ("PUT", "/soak/checkpoints/step-4/a"),
        ("POST", "/soak/a?uploads"),
        ("POST", "/soak/a?uploadId=7"),
    ]
    served = [("GET", "/soak/a"), ("HEAD", "/soak/a"), ("DELETE", "/soak/a"), ("POST", "/soak?delete")]
    assert all(writes(m, p) for m, p in refused) and not any(writes(m, p) for m, p in served)


def _store_events(*rows: tuple[str, float, int]) -> list[dict[str, object]]:
    """Ledger events (name, wall, step) of the durable tier on rank 0; a stall is a save's start."""
    return [
        {"event": name, "wall": wall, "step": step, "rank": 0, "attempt": 0}
        | ({"event": "checkpoint_stall", "phase": "start"} if name == "stall" else {})
        for name, wall, step in rows
    ]


def _window(kind: str = "full", *, opened: float = 10.0, closed: float = 16.0, refused: int = 3,
            before: int | None = 40, after: int | None = 40) -> StoreWindow:  # fmt: skip
    return StoreWindow(
        kind=kind, step=44, opened=opened, closed=closed, refused=refused, before=before, after=after
    )


def test_a_store_window_that_lost_the_last_good_checkpoint_or_after_which_no_save_committed_is_a_violation() -> (
    None
):
    events = _store_events(
        ("checkpoint_durable", 9.0, 40), ("stall", 11.0, 48), ("checkpoint_failed", 11.1, 48),
        ("stall", 17.0, 56), ("checkpoint_durable", 17.5, 56),
    )  # fmt: skip
    assert store_problems([_window()], events) == []
    assert store_problems([_window(after=52)], events) == []  # a newer one committed meanwhile
    lost = store_problems([_window(after=None)], events)
    assert len(lost) == 1 and "was step 40 when the store's window opened and none when it closed" in lost[0]
    went_back = store_problems([_window(after=36)], events)
    assert len(went_back) == 1 and "and step 36 when it closed" in went_back[0]
    never = events[:3] + _store_events(("stall", 17.0, 56), ("checkpoint_failed", 17.2, 56))
    stuck = store_problems([_window()], never)
    assert len(stuck) == 1 and "none became durable again" in stuck[0]
    # no save began after the window: nothing to judge; a save begun only in the next window is that one's
    assert store_problems([_window()], events[:3]) == []
    assert store_problems([_window(), _window("throttled", opened=16.5, closed=30.0)], never) == []


def test_store_rows_count_the_windows_the_store_refused_in_with_their_detection_and_recovery() -> None:
    events = _store_events(
        ("checkpoint_durable", 9.0, 40), ("checkpoint_failed", 11.5, 48), ("checkpoint_failed", 12.0, 52),
        ("checkpoint_durable", 17.0, 56), ("checkpoint_durable", 31.0, 96),
    )  # fmt: skip
    schedule = [SoakFault(kind="full", seconds=1, step=44), SoakFault(kind="throttled", seconds=2, step=90)]
    schedule.append(SoakFault(kind="throttled", seconds=3, step=200))
    windows = [
        _window(),
        _window("throttled", opened=25.0, closed=30.0, refused=2),
        _window("throttled", opened=40.0, closed=41.0, refused=0),  # the job ended before any request
    ]
    full, throttled = store_rows(schedule, windows, events)
    assert (full.kind, full.scheduled, full.seen, full.unreached) == ("full", 1, 1, 0)
    assert full.detect == pytest.approx((1.5,)) and full.recover == pytest.approx((1.0,))
    assert full.lost == (0.0,)  # a store fault ends no attempt
    assert (throttled.scheduled, throttled.seen, throttled.unreached) == (2, 1, 1)
    assert throttled.detect == () and throttled.recover == pytest.approx((1.0,))  # every request got through


def test_a_two_node_schedule_hits_ranks_of_both_nodes_and_leaves_the_time_after_a_node_lost_to_it() -> None:
    from goodput.drill.soak_nodes import NODE_WINDOW_SECONDS, draw_two_nodes
    from goodput.drill.soak_plan import NODE_KINDS, soak_kinds

    def draw(seed: int) -> tuple:
        return draw_two_nodes(
            seed=seed, mtbf=10, seconds=1200, step_seconds=0.01, steps=120_000, first_step=30, nproc=2,
            checks=_CHECKS,
        )  # fmt: skip

    schedule = draw(7)
    assert schedule == draw(7) and schedule != draw(8)
    assert soak_kinds(1) == KINDS and "node" not in KINDS  # a soak on one node draws what it drew before
    assert soak_kinds(2) == NODE_KINDS and {f.kind for f in schedule} == set(NODE_KINDS)
    assert {f.rank for f in schedule if f.rank is not None} == {0, 1, 2, 3}  # ranks of either node
    lost = [f for f in schedule if f.kind == "node"]
    assert len(lost) >= 3 and all(f.rank is None and f.kind in SENT and not f.plan() for f in lost)
    window = NODE_WINDOW_SECONDS / 0.01
    for (
        node
    ) in lost:  # the job trains on one node's ranks until the lost one is back: no other fault meanwhile
        assert not [f for f in schedule if node.step < f.step <= node.step + window], node
    # what the draw over four ranks held outside those windows is kept as drawn
    whole = soak_plan.draw_schedule(
        seed=7, mtbf=10, seconds=1200, step_seconds=0.01, steps=120_000, first_step=30, world=4,
        kinds=NODE_KINDS, checks=_CHECKS,
    )  # fmt: skip
    assert set(schedule) <= set(whole) and len(whole) > len(schedule)
    assert len(parse_faults(soak_plan.fault_plan(schedule))) == len(schedule) - len(lost)


def test_the_built_in_script_s_global_batch_on_two_nodes_divides_by_every_world_it_may_train_on() -> None:
    from goodput.drill.soak_nodes import demo_global_batch

    for nproc in (1, 2, 3, 4):
        batch, every = demo_global_batch(nproc), math.lcm(*range(nproc, 2 * nproc + 1))
        assert batch % every == 0, (nproc, batch)  # one node's ranks, both nodes' and any world between
        assert (
            16 * nproc <= batch < 16 * nproc + every
        )  # 8 samples a rank on both nodes, or the next multiple
    assert demo_global_batch(2) == 36  # 4 ranks x 9, 3 x 12, 2 x 18


def test_a_shrink_that_dropped_a_node_s_ranks_answers_the_node_fault_and_its_grow_is_no_fault() -> None:
    from goodput.drill.soak_checks import kind_rows
    from goodput.drill.soak_plan import SoakFault

    schedule = [
        SoakFault(kind="node", seconds=1, step=10),
        SoakFault(kind="kill", seconds=2, step=20, rank=1),
    ]
    events = [  # rank 0's: node 1 (ranks 2 and 3) lost, then a kill whose spare was not ready in time
        {"event": "shrink", "attempt": 1, "rank": 0, "failed_ranks": [2, 3]},
        {"event": "grow", "attempt": 2, "rank": 0, "joined": 2},
        {"event": "shrink", "attempt": 3, "rank": 0, "failed_ranks": [1]},
    ]
    attempts = [_attempt(0, "start"), _attempt(1, "shrink"), _attempt(2, "grow"), _attempt(3, "shrink")]
    rows = {r.kind: r for r in kind_rows(schedule, attempts, events, {}, node_ranks=2)}
    assert (rows["node"].scheduled, rows["node"].seen, rows["kill"].seen) == (1, 1, 1), rows
    assert rows["node"].detect == (1.0,)
    assert "node" not in {r.kind for r in kind_rows(schedule, attempts, events, {})}  # one node: no such row


def test_the_lineage_of_a_shrunk_and_grown_job_is_judged_on_each_step_s_own_world() -> None:
    from goodput.drill.soak_nodes import global_batch_problems

    # 8 samples, global batch 4: steps 1-2 on 4 ranks, steps 3-4 on 2 (a node lost), then 4 again (grown back)
    steps = {1: [[0], [1], [2], [3]], 2: [[4], [5], [6], [7]], 3: [[1, 5], [0, 4]], 4: [[2, 6], [3, 7]]}
    steps |= {5: [[7], [6], [5], [4]], 6: [[3], [2], [1], [0]]}
    records = _records(steps)
    assert lineage_problems(records, 6) == [] and global_batch_problems(records) == []
    short = _records({**steps, 3: [[1, 5]]})  # a step the shrunk world trained on one of its two ranks
    short = dataclasses.replace(
        short,
        steps={
            r: {s: dataclasses.replace(x, world=2) if s == 3 else x for s, x in by.items()}
            for r, by in short.steps.items()
        },
    )
    assert "1 step(s) trained by fewer ranks than their world, the first [3]" in lineage_problems(short, 6)
    assert global_batch_problems(short) == [
        "1 step(s) trained a global batch other than 4 samples, the first [3]"
    ]


def test_a_launch_past_the_drill_limit_is_killed_and_one_with_no_limit_is_waited_for() -> None:
    """A soak's uninterrupted run lasts as long as the soak (an hour, say), so it is given no limit: a scenario's
    launch past the drill's is killed as hung. Each child exits by itself once this test's pipe closes."""
    import subprocess
    import time

    from goodput.drill.runs import LaunchSpec, finish

    assert LaunchSpec().limit is not None
    waiting = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    for limit, status in ((LaunchSpec().limit, -9), (None, 0)):
        proc = subprocess.Popen(waiting, stdin=subprocess.PIPE)
        began = time.monotonic() - (LaunchSpec().limit or 0) - 1  # as if past the drill's limit already
        if limit is None:
            assert proc.stdin is not None
            proc.stdin.close()  # it ends on its own, however long it has run
        assert finish(proc, began, limit).status == status


def test_a_late_node_is_excused_only_when_its_launcher_found_the_store_gone(tmp_path: Path) -> None:
    from goodput.drill.soak_nodes import _found_store_gone
    from goodput.job.codes import EXIT_PREEMPTED
    from goodput.launch.rendezvous import rendezvous_lost

    # the launcher's own lines, from the agent error files a late node's agent writes in each case; a launch whose
    # ranks never started timed out in a first round: on one machine, the store of its own it hosted alone
    lines = {}
    for kind, started in (("RendezvousConnectionError", 1), ("RendezvousTimeoutError", 1), ("alone", 0)):
        folder = tmp_path / kind
        (folder / "pids").mkdir(parents=True)
        if started:  # ranks started: a lost node, not one never gathered
            (folder / "pids" / "rank-0").write_text("1")
        error = "RendezvousTimeoutError" if kind == "alone" else kind
        (folder / "agent-error.json").write_text(json.dumps({"message": {"message": f"{error}: "}}))
        lines[kind] = rendezvous_lost(str(folder), endpoint="127.0.0.1:1", timeout=60)
    log = tmp_path / "node-1.log"
    # (the line, whether node 1's command still ran when node 0's ended) -> excused
    for kind, outlived, excused in (
        ("RendezvousConnectionError", False, True),
        ("RendezvousTimeoutError", True, False),
        ("alone", True, True),
        ("alone", False, False),  # it timed out in the job's store while node 0 ran: never admitted
    ):
        log.write_text(f"goodput launch: rank 3 killed by SIGKILL\nnoise\ngoodput launch: {lines[kind]}\n")
        assert _found_store_gone(str(tmp_path), EXIT_PREEMPTED, outlived=outlived) is excused, kind
        assert not _found_store_gone(str(tmp_path), 1, outlived=True)  # any other exit counts
    assert not _found_store_gone(str(tmp_path / "none"), EXIT_PREEMPTED, outlived=True)  # no log: counts
