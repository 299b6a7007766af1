"""Every rank's ledger counts, each job event once: hand-built two-rank ledgers with answers worked by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from goodput.cli import main
from goodput.ledger.accounting import account
from tests.helpers.ledgers import Attempt, write_run


def _on_rank(attempt: Attempt, rank: int) -> list[dict[str, Any]]:
    return [{**e, "rank": rank} for e in attempt.events]


def _hang_on_rank_1() -> tuple[list[Attempt], list[Attempt]]:
    """Both ranks: steps 1-3 (1-4), a save 4.0-4.5 (durable 5), step 4 (4.5-5.5), step 5 starts at 5.5.

    Rank 1 hangs in step 5; its watchdog declares the failure at 35.5 after 30 s of silence and ends the
    attempt at 36. Rank 0, waiting in a collective, writes nothing more (killed by torchrun). Both restart
    at 40 (rank 1 20 ms later, on its own monotonic clock), restore step 3 and run steps 4-5.
    """
    ranks: tuple[list[Attempt], list[Attempt]] = ([], [])
    for rank, (lag, mono) in enumerate(((0.0, 1000.0), (0.02, 7777.0))):
        a0 = Attempt(0, 0.0 + lag, 0.0 + lag, mono_origin=mono)
        a0.step(1, 1, 2).step(2, 2, 3).step(3, 3, 4).save(3, 4.0, 4.5, durable=5.0).step(4, 4.5, 5.5)
        a0.add("step_start", 5.5, step=5)
        if rank == 1:
            a0.add("failure_detected", 35.5, reason="hang: no progress for 30s", silent_seconds=30.0)
            a0.add("attempt_end", 36.0, status="failed")
        a1 = Attempt(1, 40.0 + lag, 41.0, mono_origin=mono + 50.0)
        a1.add("restore_start", 41.0).add("restore_end", 42.0, step=3).step(4, 42, 43).step(5, 43, 44)
        a1.add("attempt_end", 44.0, status="ok")
        ranks[rank].extend((a0, a1))
    return ranks


def test_a_hang_detected_on_rank_1_is_failure_detection() -> None:
    """Rank 0's axis: init 1 + 1, steps 1-3 and 4-5 productive (5), stall 0.5, step 4 lost (redone: 1),
    failure_detection 5.5-35.5 (30), downtime 35.5-40 (4.5), restore 1. Sum 44 = wall."""
    rank0, rank1 = _hang_on_rank_1()
    events = [e for a in rank0 for e in _on_rank(a, 0)] + [e for a in rank1 for e in _on_rank(a, 1)]
    acc = account(events)
    expected = {
        "init": 2.0,
        "productive": 5.0,
        "checkpoint_stall": 0.5,
        "lost_work": 1.0,
        "failure_detection": 30.0,
        "restart_downtime": 4.5,
        "checkpoint_restore": 1.0,
    }
    assert {k: v for k, v in acc.categories.items() if v} == pytest.approx(expected, abs=1e-6)
    assert acc.wall_seconds == pytest.approx(44.0)
    assert acc.failures == 1 and acc.detect_seconds == pytest.approx(30.0)
    assert acc.attempts[0].failure_reason == "hang: no progress for 30s"


def test_the_report_reads_every_rank_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rank0, rank1 = _hang_on_rank_1()
    run = write_run(tmp_path / "run", rank0, rank=0)
    write_run(run, rank1, rank=1)
    assert main(["report", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["categories"]["failure_detection"] == pytest.approx(30.0)
    assert data["categories"]["restart_downtime"] == pytest.approx(4.5)
    assert not any(a["kind"] == "restart" for a in data["advice"])  # downtime is no longer blamed
    assert main(["report", str(run), "--json", "--rank", "1"]) == 0
    on_rank_1 = json.loads(capsys.readouterr().out)
    assert on_rank_1["categories"]["failure_detection"] == pytest.approx(30.0)


def test_one_restore_of_a_two_rank_job_counts_once_by_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each rank records its own ``checkpoint_restored``: attempt 1's restore of step 3 is one restore (the
    slowest rank's 0.4 s), not one per rank; attempt 2's ranks read different tiers (rank 1's RAM was lost, its
    part came from the peer node): one restore, from ``peer``, which rank 1 had to reach."""
    rank0, rank1 = _hang_on_rank_1()
    for rank, attempts in enumerate((rank0, rank1)):
        attempts[1].add("checkpoint_restored", 41.5, step=3, tier="durable", seconds=0.2 + 0.2 * rank)
        a2 = Attempt(2, 50.0, 50.5, mono_origin=9000.0 + rank)
        a2.add("checkpoint_restored", 51.0, step=4, tier="peer" if rank else "memory", seconds=0.1)
        a2.step(5, 52, 53).add("attempt_end", 54.0, status="ok")
        attempts.append(a2)
    run = write_run(tmp_path / "run", rank0, rank=0)
    write_run(run, rank1, rank=1)
    assert main(["report", str(run), "--json"]) == 0
    tiers = json.loads(capsys.readouterr().out)["restores_by_tier"]
    assert tiers == {
        "durable": {"count": 1.0, "seconds_mean": pytest.approx(0.4), "lost_steps_mean": 1.0},
        "peer": {"count": 1.0, "seconds_mean": pytest.approx(0.1), "lost_steps_mean": 1.0},
    }


def test_faults_seen_by_both_ranks_count_once_per_job_event() -> None:
    """Attempt 0: ``raise@step=2`` fires on both ranks (one job event, 2 ledger events); attempt 1: rank 1
    alone is killed at random (1), ``raise@step=5`` fires on both ranks (1); and each rank logs an eval at
    step 4 with its own loss (one job event). 5 fault_injected ledger events, 3 job events; 1 eval."""
    ranks: list[list[dict[str, Any]]] = [[], []]
    for rank in (0, 1):
        a0 = Attempt(0, 0.0, 0.1 * rank, mono_origin=100.0 * (rank + 1))
        a0.step(1, 1, 2).add("fault_injected", 2.5, action="raise", where="step 2", step=2)
        a0.add("attempt_end", 3.0, status="failed")
        a1 = Attempt(1, 10.0, 10.0 + 0.1 * rank, mono_origin=500.0 * (rank + 1))
        a1.step(2, 11, 12).add("eval", 12.5, step=4, loss=1.0 + rank)
        if rank == 1:
            a1.add("fault_injected", 13.0, action="kill", where="random after 3.0s", step=4)
        a1.add("fault_injected", 14.0, action="raise", where="step 5", step=5)
        a1.add("attempt_end", 15.0, status="failed")
        ranks[rank] = [{**e, "rank": rank} for a in (a0, a1) for e in a.events]
    custom = account(ranks[0] + ranks[1]).info["custom"]
    assert custom["fault_injected"]["count"] == 3
    assert custom["eval"]["count"] == 1
    assert account(ranks[0]).info["custom"]["fault_injected"]["count"] == 2  # what rank 0 alone saw


def test_a_job_that_failed_without_a_restart_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 1 hangs and its watchdog ends the job; no attempt follows (the launcher gave up)."""
    rank0, rank1 = _hang_on_rank_1()
    run = write_run(tmp_path / "run", rank0[:1], rank=0)
    write_run(run, rank1[:1], rank=1)
    assert main(["report", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["failures"] == 1 and data["restarts"] == 0
    assert data["categories"]["failure_detection"] == pytest.approx(30.0)
    assert data["wall_seconds"] == pytest.approx(35.5)


def test_each_node_s_cache_stats_are_kept_with_their_rank() -> None:
    """Ranks 0 and 2 are local rank 0 of two nodes; each records its node's cache counters for epoch 0."""
    events: list[dict[str, Any]] = []
    for rank, misses in ((0, 10), (2, 12)):
        a = Attempt(0, 0.0, 0.0, mono_origin=50.0 * (rank + 1))
        a.step(1, 1, 2).add("cache_stats", 2.5, epoch=0, hits=0, misses=misses)
        a.add("attempt_end", 3.0, status="ok")
        events += _on_rank(a, rank)
    stats = account(events).info["cache_stats"]
    assert sorted((s["rank"], s["misses"]) for s in stats) == [(0, 10), (2, 12)]
