"""The report's warm-restart line counts each warm restart once, though every rank records it."""

from __future__ import annotations

from goodput.ledger.text import _warm_lines
from goodput.ledger.tiers import live_recovered_share, restores_by_tier


def test_warm_restarts_are_counted_once_per_generation() -> None:
    # two ranks recorded generation 1, one rank generation 2; one more restart was cold
    info = {
        "warm_restart": [
            {"generation": 1, "detection_seconds": 0.1},
            {"generation": 1, "detection_seconds": 0.3},
            {"generation": 2, "detection_seconds": 0.2},
        ]
    }
    (line,) = _warm_lines(info, restarts=3)
    assert "restarts: 2 warm, 1 cold" in line
    assert "detection 0.2" in line  # the mean over every rank's view


def test_live_recoveries_count_as_restores_from_a_replica_once_per_generation() -> None:
    def step(attempt: int, rank: int, n: int) -> dict:
        return {"event": "step_end", "attempt": attempt, "rank": rank, "step": n}

    def warm(attempt: int, rank: int, gen: int, restored: int | None, seconds: float) -> dict:
        return {
            "event": "warm_restart",
            "attempt": attempt,
            "rank": rank,
            "generation": gen,
            "restored_step": restored,
            "restore_seconds": seconds,
        }

    events = [
        step(0, 0, 10),
        step(0, 1, 10),
        step(0, 0, 11),  # rank 0 finished step 11; rank 1 died in it
        warm(1, 0, 1, 11, 0.02),
        warm(1, 1, 1, 11, 0.06),  # the replacement took longer
        step(1, 0, 12),
        warm(2, 0, 2, None, 0.0),  # no survivor held the state: the checkpoint restore says where from
        {
            "event": "checkpoint_restored",
            "attempt": 2,
            "rank": 0,
            "tier": "memory",
            "seconds": 0.5,
            "step": 8,
        },
    ]
    tiers = restores_by_tier(events)
    assert tiers["replica"] == {"count": 1.0, "seconds_mean": 0.06, "lost_steps_mean": 0.0}
    assert tiers["memory"]["count"] == 1.0 and tiers["memory"]["lost_steps_mean"] == 4.0
    # one of two failures was live: the memory tier plans for the rest (as if one more had not been live)
    assert live_recovered_share(events, failures=2) == 1 / 3
    assert live_recovered_share([], failures=0) == 0.0
