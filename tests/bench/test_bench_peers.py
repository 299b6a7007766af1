"""`goodput bench peers`: the bookkeeping of the side-by-side runs (no timing asserted).

The exactness counts come from step records: a rollback whose redone steps train the same samples is exact, a
restart that begins the data again trains samples twice, one that skips ahead leaves samples never trained.
The short run checks that every contender gets the same failure schedule and that the counts come from what
each run's records say.
"""

from __future__ import annotations

import argparse
import json
import statistics

import pytest

from goodput.bench._peers_count import exactness
from goodput.bench._peers_faults import draw_schedule
from goodput.cli import bench
from goodput.drill.runs import processes_of


def _step(step: int, samples: list[int]) -> dict[str, object]:
    return {"step": step, "samples": samples}


# The fault-free order: 2 ranks, 2 samples per rank and step, 4 steps.
REFERENCE = {
    0: [_step(s, [4 * (s - 1), 4 * (s - 1) + 1]) for s in range(1, 5)],
    1: [_step(s, [4 * (s - 1) + 2, 4 * (s - 1) + 3]) for s in range(1, 5)],
}

# The counts of a run that trained every sample once, redid no step and missed none.
EXACT = {"samples_twice": 0, "samples_never": 0, "steps_redone": 0, "steps_missing": 0}


def _with_redo(rank0_redo: list[dict[str, object]], rank1_redo: list[dict[str, object]]) -> dict[int, list]:
    """Steps 1-3 trained, a failure, then the redo written after them (as a restarted run appends)."""
    return {0: REFERENCE[0][:3] + rank0_redo, 1: REFERENCE[1][:3] + rank1_redo}


def test_a_rollback_that_redoes_the_same_samples_is_exact() -> None:
    records = _with_redo(REFERENCE[0][1:], REFERENCE[1][1:])  # restored step 1, redid 2-4
    assert exactness(records, REFERENCE, 4) == {**EXACT, "steps_redone": 2}


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


def test_a_step_redone_by_the_survivor_of_a_shrink_is_exact() -> None:
    # rank 1 trained steps 1-3, rank 0 steps 1-2; rank 1 failed, and the survivor (a newer attempt) redid steps
    # 3-4 alone with both ranks' samples: rank 1's stale record of step 3 is not in the lineage
    alone = [
        {**_step(s, sorted(REFERENCE[0][s - 1]["samples"] + REFERENCE[1][s - 1]["samples"])), "attempt": 1}
        for s in (3, 4)
    ]
    records = {0: REFERENCE[0][:2] + alone, 1: REFERENCE[1][:3]}
    assert exactness(records, REFERENCE, 4) == EXACT


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
@pytest.mark.parametrize(
    "contenders", [("baseline", "shrink", "torchft"), ("baseline", "nvrx")], ids=["goodput", "nvrx"]
)
def test_a_short_run_applies_one_schedule_to_every_contender(capsys, tmp_path, contenders) -> None:
    # two halves, so that two test workers can run them side by side, each with the baseline the bench requires:
    # the real peers too (the peers extra is in dev), goodput's shrink beside torchft, whose failures' costs are
    # compared
    # seed 253769 of a 40 s mean: failures of rank 0 and rank 1 about 4.7 s and 9.7 s after the launch, then none
    # for 270 s, past the end of the run: early enough that a run restarted after the first failure is still
    # training at the second, and a slow machine is past its imports or restarting (a failure due while a rank
    # has no process lands once it has one; two attempts without a step are not a crash loop), not a run
    # restarted until the schedule relents (the full bench runs seed 0). The fewest steps the bench allows
    # (--steps >= 20) would end a fast machine's run before the first failure; 40 keep it training past both.
    argv = [
        "--quick",
        "--steps",
        "40",
        "--schedules",
        "40s",
        "--seed",
        "253769",
        "--contenders",
        ",".join(contenders),
    ]
    args = _args([*argv, "--keep", str(tmp_path), "--json"])
    assert draw_schedule(40.0, seed=253769, world_size=2, horizon=600.0)[:3] == [
        (4.721, 0),
        (9.69, 1),
        (279.656, 1),
    ]
    assert args.handler(args) == 0
    result = json.loads(capsys.readouterr().out)
    rows = {(r["contender"], r["schedule"]): r for r in result["rows"]}
    assert set(rows) == {(c, s) for c in contenders for s in ("40s", "none")}
    schedule = [list(x) for x in result["schedules"]["40s"]]
    for contender in contenders:
        kills = rows[contender, "40s"]["kills"]
        assert kills, f"{contender} received no failure"
        # the failures each run received are the schedule's first ones, in order, at or after their time
        assert [[k["due"], k["rank"]] for k in kills] == schedule[: len(kills)]
        assert all(k["fired"] >= k["due"] for k in kills)
        assert rows[contender, "none"]["kills"] == []
        assert rows[contender, "40s"]["steps_missing"] == 0
        # each failure was answered by a restart or a reshape in place, as the run's own ledger says
        assert rows[contender, "40s"]["restarts"] + rows[contender, "40s"]["reshapes"] >= 1
        assert rows[contender, "none"]["restarts"] == rows[contender, "none"]["reshapes"] == 0
    # each failure's cost is measured against the same contender's fault-free run
    for contender in contenders:
        row = rows[contender, "40s"]
        free = rows[contender, "none"]["wall_seconds"]
        assert row["lost_per_failure"] == round((row["wall_seconds"] - free) / len(row["kills"]), 2)
    if "shrink" in contenders:
        # every goodput run is exact; the counts are computed from the records (a fault-free run is its own
        # reference); and shrink's cost per failure is set beside torchft's
        assert rows["shrink", "40s"]["samples_twice"] == rows["shrink", "40s"]["samples_never"] == 0
        assert result["ratios"]["goodput_samples_wrong"] == 0
        assert 0 < rows["shrink", "none"]["goodput"] <= 1
        shrink, torchft = (
            rows["shrink", "40s"]["lost_per_failure"],
            rows["torchft", "40s"]["lost_per_failure"],
        )
        assert result["ratios"]["shrink_over_torchft_lost_per_failure"] == {"40s": round(shrink / torchft, 3)}
    assert rows["baseline", "none"]["samples_twice"] == 0 and rows["baseline", "none"]["steps_redone"] == 0
    assert 0 < rows["baseline", "40s"]["goodput"] <= 1
    # nothing of any run outlives the bench (a rank's forked data-loader worker once did)
    left = {str(run): processes_of(str(run)) for run in tmp_path.glob("peers-*/*-*") if run.is_dir()}
    assert not any(left.values()), left


def _kept(folder, steps: int) -> None:
    """A folder as a ``--keep`` run leaves it: rows.jsonl and each fault-free run's step records."""
    folder.mkdir()
    rows = [
        {"schedule": "none", "contender": c, "wall_seconds": 10.0, "samples_twice": 0} for c in ("baseline",)
    ]
    rows.append({"schedule": "40s", "contender": "baseline", "wall_seconds": 12.0, "samples_twice": 0})
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = folder / "baseline-none" / "samples"
    samples.mkdir(parents=True)
    for rank in (0, 1):
        lines = (json.dumps(_step(s, [4 * s + rank])) for s in range(1, steps + 1))
        (samples / f"rank-{rank}.jsonl").write_text("\n".join(lines) + "\n")


def test_a_split_run_reuses_the_fault_free_runs_of_the_folder_it_names(tmp_path) -> None:
    from goodput.bench.peers import _reference
    from goodput.errors import ConfigError

    _kept(tmp_path / "kept", steps=30)
    rows, records = _reference(str(tmp_path / "kept"), ["baseline"], 30)
    assert [(r["contender"], r["schedule"]) for r in rows] == [("baseline", "none")]  # not its 40s row
    assert set(records) == {("baseline", "none")} and len(records["baseline", "none"][1]) == 30
    with pytest.raises(ConfigError, match="trained \\[30\\] steps, not --steps 40"):
        _reference(str(tmp_path / "kept"), ["baseline"], 40)
    with pytest.raises(ConfigError, match="no fault-free run of warm"):
        _reference(str(tmp_path / "kept"), ["baseline", "warm"], 30)
    with pytest.raises(ConfigError, match="not a folder a --keep run left"):
        _reference(str(tmp_path / "elsewhere"), ["baseline"], 30)


def test_repeated_fault_free_rounds_are_compared_by_their_medians() -> None:
    from goodput.bench._peers_ratios import ratios as _ratios
    from goodput.bench._peers_ratios import summary as _summary

    def row(contender: str, schedule: str, wall: float, round_: int = 0) -> dict[str, object]:
        extra = {"round": round_} if round_ else {}
        return {"schedule": schedule, "contender": contender, "wall_seconds": wall, "samples_twice": 0,
                "samples_never": 0, **extra}  # fmt: skip

    # three rounds; the machine was loaded during round 1 (every contender slower), and warm's round 2 is odd
    walls = {"baseline": (50.0, 70.0, 51.0), "warm": (48.0, 66.0, 60.0), "bare": (47.0, 64.0, 46.0),
             "shrink": (47.5, 65.0, 49.0)}  # fmt: skip
    rows = [row(c, "none", w[n], n) for n in range(3) for c, w in walls.items()]
    rows.append(row("baseline", "40s", 80.0))
    rows.append(row("warm", "40s", 68.0))
    _ratios(rows)
    summary = _summary(rows)
    assert summary["no_faults_warm_over_bare"] == round(60.0 / 47.0, 3)  # the medians, not the first round's
    assert summary["no_faults_warm_over_bare_by_round"] == [
        round(48 / 47, 3),
        round(66 / 64, 3),
        round(60 / 46, 3),
    ]
    # shrink's fault-free run is warm with no hot spare: its price is listed beside warm's, not as the goal
    assert summary["no_faults_over_bare"] == {"warm": round(60 / 47, 3), "shrink": round(49 / 47, 3)}
    warm40 = next(r for r in rows if r["contender"] == "warm" and r["schedule"] == "40s")
    assert warm40["over_fault_free"] == round(68.0 / 60.0, 3) and warm40["over_baseline"] == round(68 / 80, 3)
    assert summary["warm_over_baseline_at_40s"] == round(68 / 80, 3)


def test_repeat_below_one_is_refused() -> None:
    from goodput.errors import ConfigError

    args = _args(["--repeat", "0"])
    with pytest.raises(ConfigError, match="--repeat must be >= 1"):
        args.handler(args)


def test_each_failure_s_cost_is_compared_with_torchft_s_under_the_same_schedule() -> None:
    from goodput.bench._peers_ratios import ratios as _ratios
    from goodput.bench._peers_ratios import summary as _summary

    def row(contender: str, schedule: str, wall: float, kills: int) -> dict[str, object]:
        return {"schedule": schedule, "contender": contender, "wall_seconds": wall, "samples_twice": 0,
                "samples_never": 0, "kills": [{"rank": 0}] * kills}  # fmt: skip

    rows = [row(c, "none", w, 0) for c, w in (("baseline", 50.0), ("warm", 40.0), ("torchft", 42.0))]
    rows += [row("baseline", "20s", 70.0, 4), row("warm", "20s", 46.0, 4), row("torchft", "20s", 54.0, 3)]
    rows += [row("shrink", "20s", 48.0, 4)]  # no fault-free run of its own: no cost per failure
    _ratios(rows)
    lost = {r["contender"]: r["lost_per_failure"] for r in rows if r["schedule"] == "20s"}
    assert lost == {"baseline": 5.0, "warm": 1.5, "torchft": 4.0, "shrink": None}
    assert all(r["lost_per_failure"] is None for r in rows if r["schedule"] == "none")
    summary = _summary(rows)
    assert summary["warm_over_torchft_lost_per_failure"] == {"20s": round(1.5 / 4.0, 3)}
    assert "shrink_over_torchft_lost_per_failure" not in summary
    assert summary["warm_over_torchft_time"] == {"none": round(40 / 42, 3), "20s": round(46 / 54, 3)}
    assert summary["no_faults_warm_over_torchft"] == round(40 / 42, 3)


def test_the_slowest_row_over_the_baseline_is_goodput_s_own() -> None:
    """The goal "slowest over the baseline <= 1" is goodput's: a slower peer's row (torchtitan's own
    checkpointer, torchft) does not stand for it."""
    from goodput.bench._peers_ratios import ratios as _ratios
    from goodput.bench._peers_ratios import summary as _summary

    walls = {"baseline": 50.0, "warm": 45.0, "shrink": 48.0, "titan": 60.0, "torchft": 55.0}
    rows = [
        {
            "schedule": "40s",
            "contender": c,
            "wall_seconds": w,
            "samples_twice": 0,
            "samples_never": 0,
            "kills": [],
        }
        for c, w in walls.items()
    ]
    _ratios(rows)
    assert _summary(rows)["slowest_over_baseline"] == round(48.0 / 50.0, 3)


def test_the_real_peers_need_the_peers_extra_only_when_asked_for(monkeypatch) -> None:
    from goodput.bench import peers
    from goodput.errors import ConfigError

    monkeypatch.setattr(peers, "peer_available", lambda module: False)
    for contender, module in (("torchft", "torchft"), ("nvrx", "nvidia_resiliency_ext")):
        args = _args(["--contenders", f"baseline,{contender}"])
        with pytest.raises(ConfigError, match=rf"{contender} needs {module}: pip install 'goodput\[peers\]'"):
            args.handler(args)


def test_a_schedule_a_run_ended_before_is_named_and_the_baseline_is_required() -> None:
    from goodput.bench.peers import unmet_schedules
    from goodput.errors import ConfigError

    kill = {"due": 27.2, "rank": 1, "fired": 27.3}
    rows = [
        {"schedule": "none", "contender": "baseline", "wall_seconds": 40.0, "kills": []},
        {"schedule": "40s", "contender": "baseline", "wall_seconds": 52.0, "kills": [kill]},
        {"schedule": "40s", "contender": "warm", "wall_seconds": 45.0, "kills": [kill]},
        {"schedule": "120s", "contender": "baseline", "wall_seconds": 41.0, "kills": []},
        {"schedule": "120s", "contender": "warm", "wall_seconds": 44.0, "kills": []},
        {"schedule": "120s", "contender": "shrink", "error": "timed out"},
    ]
    assert unmet_schedules(rows) == {
        "120s": "baseline, warm received no failure in 44 s or less: raise --steps so that the job outlasts "
        "several of this schedule's failures"
    }
    args = _args(["--contenders", "warm,shrink"])
    with pytest.raises(ConfigError, match="--contenders must include baseline"):
        args.handler(args)
    args = _args(["--contenders", "baseline,bogus"])
    with pytest.raises(ConfigError, match="unknown: bogus"):
        args.handler(args)


def test_several_seeds_are_compared_seed_by_seed_and_summed_up_by_their_medians() -> None:
    """Under ``--seed 0,1,2`` each contender's cost per failure is divided by its peer's under the same seed (the
    very same failures), and the schedule's ratio is the median of those, not a ratio of pooled figures."""
    from goodput.bench._peers_ratios import ratios, summary
    from goodput.bench.peers import unmet_schedules

    def row(
        contender: str, schedule: str, wall: float, kills: int, seed: int | None = None
    ) -> dict[str, object]:
        extra = {} if seed is None else {"seed": seed}
        return {"schedule": schedule, "contender": contender, "wall_seconds": wall, "samples_twice": 0,
                "samples_never": 0, "kills": [{"rank": 1}] * kills, **extra}  # fmt: skip

    free = {"baseline": 50.0, "warm": 40.0, "torchft": 42.0, "shrink": 41.0}
    rows = [row(c, "none", w, 0) for c, w in free.items()]
    # (seed, kills, baseline, warm, torchft, shrink): seed 2 met one failure only and a slow warm run
    runs = [(0, 4, 70.0, 44.0, 50.0, 45.0), (1, 2, 60.0, 42.0, 46.0, 45.0), (2, 1, 55.0, 46.0, 43.0, 42.0)]
    for seed, kills, *walls in runs:
        rows += [
            row(c, "20s", w, kills, seed)
            for c, w in zip(("baseline", "warm", "torchft", "shrink"), walls, strict=True)
        ]
    ratios(rows)
    warm1 = next(r for r in rows if r["contender"] == "warm" and r.get("seed") == 1)
    assert warm1["over_baseline"] == round(42.0 / 60.0, 3)  # the baseline under seed 1, not another seed's
    assert warm1["lost_per_failure"] == 1.0
    out = summary(rows)
    # warm over torchft per seed: (4/4)/(8/4) = 0.5, (2/2)/(4/2) = 0.5, 6/1 = 6: the median 0.5
    assert out["warm_over_torchft_lost_per_failure"] == {"20s": 0.5}
    assert out["warm_over_torchft_lost_per_failure_by_seed"] == {"20s": [0.5, 0.5, 6.0]}
    # warm over the baseline: 1/5, 1/5, 6/5
    assert out["warm_over_baseline_lost_per_failure"] == {"20s": 0.2}
    assert out["shrink_over_baseline_lost_per_failure_by_seed"] == {"20s": [0.2, 0.4, 0.2]}
    # time to N over torchft's: 44/50, 42/46, 46/43 seed by seed
    assert out["warm_over_torchft_time"] == {"none": round(40 / 42, 3), "20s": round(42 / 46, 3)}
    assert out["step_efficiency"]["warm"] == {"20s": round(statistics.median([40 / 44, 40 / 42, 40 / 46]), 3)}
    rows.append(row("torchft", "40s", 42.5, 0, 1))
    assert list(unmet_schedules(rows)) == ["40s seed 1"]


def test_the_ledger_s_cost_per_failure_is_its_failure_time_and_its_extra_start_ups() -> None:
    """Within one run, the ledger's account of the failures: the time in a failure's categories, plus the start-up
    and warm-up beyond the contender's fault-free run (a cold restart imports again), over the failures. Slower
    steps in one run than in the other (the productive time) are in the wall-time figure, not in this one."""
    from goodput.bench._peers_ratios import ratios, summary

    def row(contender: str, schedule: str, wall: float, kills: int, **categories: float) -> dict[str, object]:
        return {"schedule": schedule, "contender": contender, "wall_seconds": wall, "samples_twice": 0,
                "samples_never": 0, "kills": [{"rank": 1}] * kills, "categories": categories}  # fmt: skip

    rows = [
        row("baseline", "none", 50.0, 0, productive=47.0, init=2.5, warmup=0.5),
        row("warm", "none", 40.0, 0, productive=38.0, init=1.5, warmup=0.3, other=0.2),
        # 4 cold restarts: 2 s of imports and 0.2 s of warm-up again each, 0.3 s downtime, 1 s of lost steps
        row(
            "baseline",
            "20s",
            70.0,
            4,
            productive=49.0,
            init=10.5,
            warmup=1.3,
            restart_downtime=1.2,
            lost_work=4.0,
            checkpoint_restore=0.4,
        ),
        # 4 hand-overs, 0.2 s each, and 2.2 s of slower steps than in the fault-free run
        row(
            "warm",
            "20s",
            43.0,
            4,
            productive=40.2,
            init=1.5,
            warmup=0.2,
            failure_detection=0.4,
            checkpoint_restore=0.4,
            other=0.3,
        ),
    ]
    ratios(rows)
    lost = {r["contender"]: r["ledger_lost_per_failure"] for r in rows if r["schedule"] == "20s"}
    assert lost == {
        "baseline": pytest.approx((8.0 + 0.8 + 1.2 + 4.0 + 0.4) / 4),
        "warm": pytest.approx(0.8 / 4),
    }
    assert all("ledger_lost_per_failure" not in r for r in rows if r["schedule"] == "none")
    out = summary(rows)
    assert out["warm_over_baseline_ledger_lost_per_failure"] == {"20s": round(0.2 / 3.6, 3)}
    assert out["warm_over_baseline_lost_per_failure"] == {"20s": round(0.75 / 5.0, 3)}  # the wall times'


@pytest.mark.parametrize("seed", ["a,b", ","])
def test_a_seed_that_is_not_a_list_of_integers_is_refused(seed: str) -> None:
    from goodput.errors import ConfigError

    args = _args(["--seed", seed])
    with pytest.raises(ConfigError, match="--seed: give"):
        args.handler(args)
