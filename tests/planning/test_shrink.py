"""The shrink-and-regrow model against a simulation of the job it describes, and its ``goodput plan`` section."""

from __future__ import annotations

import json
import random

import pytest

from goodput.cli import main
from goodput.errors import ConfigError
from goodput.planning import goodput_shrink


def _simulate(
    *,
    mtbf: float,
    ranks: int,
    shrink: float,
    grow: float,
    regrow: float,
    detect: float,
    failures: int,
    seed: int,
) -> tuple[float, float]:
    """(goodput, capacity goodput) of a job whose failures come at random (exponential gaps of ``mtbf``), each
    stopping training for ``detect + shrink`` and taking one rank away until a replacement is ready ``regrow``
    after the failure was noticed, whose joining stops training for ``grow``. Training stops pile up when
    they overlap; a rank lost while another is missing is one more missing."""
    rng = random.Random(seed)
    events: list[tuple[float, int]] = []
    t = 0.0
    for _ in range(failures):
        t += rng.expovariate(1.0 / mtbf)
        events += [(t, -1), (t + detect + regrow, +1)]
    horizon = t + mtbf
    events = sorted(e for e in events if e[0] < horizon)
    now, busy_until, world, productive, rank_seconds = 0.0, 0.0, ranks, 0.0, 0.0
    for when, change in [*events, (horizon, 0)]:
        start = max(now, busy_until)
        if when > start:
            productive += when - start
            rank_seconds += (when - start) * world
        now = when
        if change:
            busy_until = max(busy_until, when) + (detect + shrink if change < 0 else grow)
            world += change
    return productive / horizon, rank_seconds / (ranks * horizon)


@pytest.mark.parametrize(
    ("mtbf", "regrow"),
    [(200.0, 30.0), (100.0, 60.0), (60.0, 20.0)],
)
def test_the_model_matches_a_simulated_job(mtbf: float, regrow: float) -> None:
    """First order: within half a point while a failure's costs stay a few percent of the MTBF."""
    costs = {"shrink": 2.0, "grow": 3.0, "detect": 1.0}
    model = goodput_shrink(mtbf=mtbf, ranks=4, regrow=regrow, **costs)
    simulated = _simulate(mtbf=mtbf, ranks=4, regrow=regrow, failures=20_000, seed=1, **costs)
    assert model.goodput == pytest.approx(simulated[0], abs=0.005)
    assert model.capacity_goodput == pytest.approx(simulated[1], abs=0.005)
    assert model.capacity_goodput < model.goodput  # the time short of a rank counts


def test_a_replacement_ready_before_the_shrink_is_done_costs_no_capacity() -> None:
    model = goodput_shrink(mtbf=100.0, ranks=8, shrink=5.0, grow=5.0, regrow=4.0)
    assert model.goodput == pytest.approx(0.9)
    assert model.capacity_goodput == pytest.approx(model.goodput)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ranks": 1}, "a job of 1 rank"),
        ({"shrink": -1.0}, "shrink must be >= 0"),
        ({"regrow": float("inf")}, "regrow must be >= 0"),
        ({"mtbf": 0.0}, "mtbf must be > 0"),
        ({"base": 1.5}, "base goodput must be in"),
    ],
)
def test_bad_inputs_are_named(kwargs: dict[str, float], message: str) -> None:
    args = {"mtbf": 100.0, "ranks": 4, "shrink": 1.0, "grow": 1.0, "regrow": 10.0, **kwargs}
    with pytest.raises(ConfigError, match=message):
        goodput_shrink(**args)  # type: ignore[arg-type]


PLAN = ["plan", "--failures-per-day", "24", "--ckpt-stall", "20s", "--restart", "5m", "--shrink", "20s",
        "--grow", "40s", "--regrow", "10m", "--ranks", "512", "--step-time", "2s"]  # fmt: skip


def test_plan_json_has_the_shrink_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    section = plan["shrink"]
    # M = 1 h; K = D + S + G + L = 0 + 20 + 40 + 1 = 61 s; T - S = 580 s missing per failure, over 512 ranks.
    interval = plan["recommended"]["interval_hours"] * 3600
    base = interval / (interval + 20.0)
    assert section["goodput"] == pytest.approx(base * (1 - 61 / 3600))
    missing = 580 / 3600 / 512
    assert section["capacity_goodput"] == pytest.approx(section["goodput"] * (1 - missing))
    assert section["lost"] == pytest.approx(1.0) and section["regrow"] == pytest.approx(600.0)


def test_plan_text_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """--grow defaults to --shrink, --regrow to --restart, --ranks to --gpus."""
    argv = ["plan", "--gpus", "64", "--afr", "0.5", "--restart", "3m", "--shrink", "10s", "--json"]
    assert main(argv) == 0
    section = json.loads(capsys.readouterr().out)["shrink"]
    assert (section["grow"], section["regrow"], section["ranks"]) == (10.0, 180.0, 64)
    assert main(PLAN) == 0
    out = capsys.readouterr().out
    assert "no spare: shrink in place and grow back  (512 ranks reserved)" in out
    assert "capacity goodput" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--failures-per-day", "24", "--grow", "3s"], "--grow plans a shrink in place: give --shrink too"),
        (["--failures-per-day", "24", "--shrink", "3s"], "--shrink needs the job's size"),
        (
            ["--failures-per-day", "24", "--shrink", "-3s", "--ranks", "4"],
            "--shrink '-3s' must not be negative",
        ),
        (["--failures-per-day", "24", "--shrink", "3s", "--ranks", "1"], "a job of 1 rank"),
    ],
)
def test_plan_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
