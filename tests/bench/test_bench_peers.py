"""`goodput bench peers`: the bookkeeping of the side-by-side runs (no timing asserted).

The exactness counts come from step records: a rollback whose redone steps train the same samples is exact, a
restart that begins the data again trains samples twice, one that skips ahead leaves samples never trained.
The short run checks that every contender gets the same failure schedule and that the counts come from what
each run's records say.
"""

from __future__ import annotations

import argparse
import json

import pytest

from goodput.bench._peers_count import exactness
from goodput.bench._peers_faults import draw_schedule
from goodput.cli import bench


def _step(step: int, samples: list[int]) -> dict[str, object]:
    return {"step": step, "samples": samples}


# The fault-free order: 2 ranks, 2 samples per rank and step, 4 steps.
REFERENCE = {
    0: [_step(s, [4 * (s - 1), 4 * (s - 1) + 1]) for s in range(1, 5)],
    1: [_step(s, [4 * (s - 1) + 2, 4 * (s - 1) + 3]) for s in range(1, 5)],
}


def _with_redo(rank0_redo: list[dict[str, object]], rank1_redo: list[dict[str, object]]) -> dict[int, list]:
    """Steps 1-3 trained, a failure, then the redo written after them (as a restarted run appends)."""
    return {0: REFERENCE[0][:3] + rank0_redo, 1: REFERENCE[1][:3] + rank1_redo}


def test_a_rollback_that_redoes_the_same_samples_is_exact() -> None:
    records = _with_redo(REFERENCE[0][1:], REFERENCE[1][1:])  # restored step 1, redid 2-4
    assert exactness(records, REFERENCE, 4) == {
        "samples_twice": 0,
        "samples_never": 0,
        "steps_redone": 2,
        "steps_missing": 0,
    }


def test_a_restart_that_begins_the_data_again_trains_samples_twice() -> None:
    # restored the model at step 1 but the loader at the start: steps 2-4 get the samples of steps 1-3
    redo0 = [_step(s, [4 * (s - 2), 4 * (s - 2) + 1]) for s in range(2, 5)]
    redo1 = [_step(s, [4 * (s - 2) + 2, 4 * (s - 2) + 3]) for s in range(2, 5)]
    counts = exactness(_with_redo(redo0, redo1), REFERENCE, 4)
    assert counts["samples_twice"] == 4 and counts["samples_never"] == 4  # step 1's again, step 4's never


def test_a_restart_that_skips_ahead_leaves_samples_never_trained() -> None:
    # restored step 2's model, but the loader one step ahead: step 3 trains step 4's samples, step 4 new ones
    redo0 = [_step(3, [12, 13]), _step(4, [16, 17])]
    redo1 = [_step(3, [14, 15]), _step(4, [18, 19])]
    counts = exactness(_with_redo(redo0, redo1), REFERENCE, 4)
    assert counts["samples_never"] == 4 and counts["samples_twice"] == 4  # 8-11 never; 16-19 beyond N


def test_the_schedule_is_a_function_of_its_seed() -> None:
    one = draw_schedule(10.0, seed=3, world_size=2, horizon=200.0)
    assert one == draw_schedule(10.0, seed=3, world_size=2, horizon=200.0)
    assert one != draw_schedule(10.0, seed=4, world_size=2, horizon=200.0)
    assert all(0 < t < 200 and r in (0, 1) for t, r in one) and len(one) > 5
    assert draw_schedule(None, seed=3, world_size=2, horizon=200.0) == []


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="goodput")
    bench.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", "peers", *argv])


@pytest.mark.slow
def test_a_short_run_applies_one_schedule_to_every_contender(capsys, tmp_path) -> None:
    # seed 704 of a 40 s mean: failures of rank 0 and rank 1 about 13 s and 17 s in, once both contenders train
    # (a burst at start-up, before any step, is what goodput's crash-loop guard stops on), then none for
    # 300 s, past the end of 40 steps: two failures each, not a run restarted until the schedule relents
    # (the full bench runs seed 0)
    argv = [
        "--quick",
        "--steps",
        "40",
        "--schedules",
        "40s",
        "--seed",
        "704",
        "--contenders",
        "baseline,warm",
    ]
    args = _args([*argv, "--keep", str(tmp_path), "--json"])
    assert [t for t, _ in draw_schedule(40.0, seed=704, world_size=2, horizon=600.0)][:3] == [
        13.362,
        17.117,
        302.738,
    ]
    assert args.handler(args) == 0
    result = json.loads(capsys.readouterr().out)
    rows = {(r["contender"], r["schedule"]): r for r in result["rows"]}
    assert set(rows) == {(c, s) for c in ("baseline", "warm") for s in ("40s", "none")}
    schedule = [list(x) for x in result["schedules"]["40s"]]
    for contender in ("baseline", "warm"):
        kills = rows[contender, "40s"]["kills"]
        assert kills, f"{contender} received no failure"
        # the failures each run received are the schedule's first ones, in order, at or after their time
        assert [[k["due"], k["rank"]] for k in kills] == schedule[: len(kills)]
        assert all(k["fired"] >= k["due"] for k in kills)
        assert rows[contender, "none"]["kills"] == []
        assert rows[contender, "40s"]["steps_missing"] == 0
    # every goodput run is exact; the counts are computed from the records (a fault-free run is its own reference)
    assert rows["warm", "40s"]["samples_twice"] == rows["warm", "40s"]["samples_never"] == 0
    assert rows["baseline", "none"]["samples_twice"] == 0 and rows["baseline", "none"]["steps_redone"] == 0
    assert result["ratios"]["goodput_samples_wrong"] == 0
    assert 0 < rows["warm", "none"]["goodput"] <= 1 and 0 < rows["baseline", "40s"]["goodput"] <= 1
