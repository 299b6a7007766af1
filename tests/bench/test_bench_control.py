"""`goodput bench control`: at two world sizes, every figure the table prints comes out of the runs' own
records, with the relations a hand-over, a shrink and a grow must show (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from goodput.bench._control_runs import busy_share
from goodput.cli import main
from tests.helpers.commands import refused_in_one_line


def test_the_busy_share_is_taken_between_the_samples_around_the_window() -> None:
    # (wall, busy jiffies, total jiffies) over 2 cores at 100 Hz: idle until 1.0, both cores busy 1.0-2.0,
    # one of them 2.0-3.0
    cpu = [(0.0, 0, 0), (0.5, 0, 100), (1.0, 0, 200), (1.5, 100, 300), (2.0, 200, 400), (3.0, 300, 600)]
    assert busy_share(cpu, 1.0, 2.0) == pytest.approx(1.0)
    assert busy_share(cpu, 1.2, 1.9) == pytest.approx(1.0)  # widened to the samples at 1.0 and 2.0
    assert busy_share(cpu, 1.0, 3.0) == pytest.approx(0.75)
    assert busy_share(cpu, 0.0, 1.0) == pytest.approx(0.0)
    assert busy_share(cpu, 2.5, 3.5) is None and busy_share(cpu, None, 2.0) is None


def test_a_bad_rank_list_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    bad = (["--ranks", "1,4"], ["--ranks", "two"], ["--modes", "warm,cold"])
    err = refused_in_one_line(capsys, *(["bench", "control", *argv] for argv in bad))
    assert err.count("--ranks") == 2 and "--modes" in err


@pytest.mark.slow
def test_each_world_size_gets_a_hand_over_a_shrink_and_a_grow_with_their_store_operations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [
        "bench",
        "control",
        "--ranks",
        "3,2",
        "--kill-at",
        "30",
        "--after",
        "250",
        "--step-seconds",
        "0.02",
    ]
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ranks"] == [2, 3] and set(result["by_ranks"]) == {"2", "3"}
    for n in (2, 3):
        row = result["by_ranks"][str(n)]
        assert all(run["cold_restarts"] == 0 for run in row["runs"].values()), row["runs"]
        assert all(
            run["start_to_first_step_seconds"] > run["last_join_to_first_step_seconds"] > 0
            for run in row["runs"].values()
        )
        # every rank of the new group recorded the recovery: N after a hand-over or a grow, N-1 after a shrink
        assert (row["warm"]["ranks"], row["shrink"]["ranks"], row["grow"]["ranks"]) == (n, n - 1, n)
        for kind in ("warm", "shrink", "grow"):
            part = row[kind]
            assert part["worker_store_ops"] > 0 and part["agent_store_ops"] > 0, (kind, part)
            assert part["store_ops"] == part["worker_store_ops"] + part["agent_store_ops"]
            assert part["store_ops_per_rank"] == pytest.approx(part["store_ops"] / n)
            assert part["to_next_step_seconds"] > 0 and part["max_reform_seconds"] >= part["reform_seconds"]
            assert 0 <= part["cpu_busy"] <= 1, (kind, part)
    ratios = result["ratios"]
    assert set(ratios["warm_store_ops_per_failure_per_rank"]) == {"2", "3"}
    assert ratios["warm_at_3_over_at_2"] > 0
