"""``goodput plan``: the JSON object, the table, the plot, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from goodput.cli import main

DEMO = [
    "plan", "--gpus", "1024", "--days", "30", "--afr", "0.01", "--interval", "15m", "30m", "1h", "2h",
    "--ckpt-stall", "20s", "--persist", "90s", "--restart", "10m", "--detect", "2m",
]  # fmt: skip


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_the_promised_keys_and_values(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run([*DEMO, "--json"], capsys)
    assert code == 0, err
    plan = json.loads(out)
    # 1024 * 0.01 * 30 / 365 = 0.841644 expected failures; P = 1 - e^-0.841644 = 0.568998.
    assert plan["failure_probability"] == pytest.approx(0.568998, abs=2e-6)
    # 31,536,000 s / 10.24 = 3,079,687.5 s = 855.469 h.
    assert plan["mtbf_hours"] == pytest.approx(855.469, abs=1e-3)
    assert [row["interval_hours"] for row in plan["rows"]] == [0.25, 0.5, 1.0, 2.0]
    one_hour = plan["rows"][2]
    # 30 m lost + 90 s persist + 10 m restart + 2 m detect = 1800 + 90 + 600 + 120 = 2610 s = 0.725 h.
    assert one_hour["expected_waste_per_failure_hours"] == pytest.approx(0.725)
    # Stalls: 24 checkpoints * 20 s = 480 s; failures: 86400 / 3,079,687.5 = 0.0280548 a day * 2610 s = 73.22 s;
    # 553.22 s a day = 0.153673 h.
    assert one_hour["daily_waste_hours"] == pytest.approx(0.153673, abs=1e-6)
    assert 0.99 < one_hour["goodput"] < 1.0
    assert set(plan["rows"][0]) >= {
        "interval_hours",
        "expected_waste_per_failure_hours",
        "daily_waste_hours",
        "goodput",
    }
    best = plan["optimal_interval_hours"]
    # Young: sqrt(2 * 20 * 3,079,687.5) = sqrt(123,187,500) = 11,098.99 s = 3.08305 h.
    assert best["young"] == pytest.approx(3.08305, abs=1e-5)
    assert best["daly"] == pytest.approx(best["exact"], rel=1e-3)
    assert best["exact"] * 3600 >= 90
    # The recommendation beats every interval the user asked about.
    assert plan["recommended"]["goodput"] >= max(row["goodput"] for row in plan["rows"])


def test_failures_per_day_and_simulation(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "plan",
        "--failures-per-day",
        "8.6",
        "--days",
        "7",
        "--interval",
        "2h",
        "--json",
        "--simulate",
        "300",
    ]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    row = json.loads(out)["rows"][0]
    # The anchor, first order: 1 - 8.6 h / 24 h = 0.641667; Daly's exact model gives 0.684105.
    assert row["goodput_first_order"] == pytest.approx(0.641667, abs=1e-6)
    assert row["daily_waste_hours"] == pytest.approx(8.6)
    sim = row["simulated"]
    assert sim["runs"] == 300
    assert abs(sim["goodput_mean"] - row["goodput"]) < 5 * sim["goodput_stderr"] + 0.01


def test_table_reads_well(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(DEMO, capsys)
    assert code == 0
    assert "failure probability  56.90%" in out
    assert "855.5 h (35.6 days)" in out
    assert "recommended interval 3.08h" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["interval"])
    assert [line.split()[0] for line in lines[header + 1 : header + 5]] == ["15m", "30m", "60m", "2h"]


def test_plot_is_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "plan.png"
    code, out, err = _run([*DEMO, "--plot", str(target)], capsys)
    assert code == 0, err
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.stat().st_size > 20_000  # a drawn figure, not an empty canvas
    assert str(target) in out


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["plan", "--help"], capsys)
    assert code == 0
    assert "examples:" in out and "--failures-per-day 8.6" in out and "--ckpt-stall" in out


BAD = [
    (["--gpus", "-5", "--afr", "0.01", "--days", "30"], "gpus"),
    (["--gpus", "8", "--afr", "1.5", "--days", "30"], "afr"),
    (["--gpus", "8", "--afr", "0.01", "--days", "30", "--interval", "2"], "--interval '2'"),
    (["--gpus", "8", "--afr", "0.01", "--days", "30", "--ckpt-stall", "20"], "--ckpt-stall"),
    (["--gpus", "8", "--afr", "0.01", "--days", "30", "--interval", "0m"], "--interval"),
    (["--failures-per-day", "3", "--gpus", "8", "--afr", "0.01", "--days", "30"], "conflicts"),
    (["--gpus", "8", "--days", "30"], "--afr"),
    (["--afr", "0.01", "--days", "30"], "--gpus"),
    (["--days", "30"], "--failures-per-day"),
    (["--failures-per-day", "3", "--days", "0"], "days"),
    (["--failures-per-day", "3", "--days", "1", "--simulate", "1"], "--simulate"),
    (["--gpus", "8", "--afr", "0.01", "--ckpt-stall", "-30s"], "--ckpt-stall '-30s' must not be negative"),
    (["--gpus", "8", "--afr", "0.01", "--interval", "1h", "-30m"], "--interval '-30m' must not be negative"),
    (["--gpus", "8", "--afr", "0.01", "--days", "-2d"], "--days '-2d' must not be negative"),
    (["--gpus", "8", "--afr", "0.01", "--days", "3 weeks"], "--days"),
    (["--gpus", "8", "--afr", "0.01", "--plot", "/nonexistent/plan.png"], "does not exist"),
    (["--failures-per-day", "3", "--gpus", "8"], "--observed-gpus"),
    (["--failures-per-day", "3", "--observed-gpus", "8"], "--observed-gpus"),
    (["--failures-per-day", "3", "--simulate", "10"], "--simulate needs --days"),
    (["--gpus", "many", "--afr", "0.01", "--days", "3"], "--gpus"),
]


@pytest.mark.parametrize(("args", "says"), BAD, ids=[" ".join(args) for args, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["plan", *args], capsys)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert says in err
    assert "Traceback" not in err


@pytest.mark.parametrize("args", [BAD[0][0], BAD[2][0], BAD[5][0]])
def test_bad_input_from_a_real_process(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "goodput", "plan", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("goodput plan: error:")


def test_free_checkpoints_recommend_the_shortest_interval(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(
        ["plan", "--failures-per-day", "8.6", "--days", "1", "--restart", "10m", "--json"], capsys
    )
    assert code == 0, err
    recommended = json.loads(out)["recommended"]
    assert recommended["interval_hours"] == 0
    # Only restarts are left to lose: 600 s * 8.6 / 86400 s = 0.059722 of the time; exp(-0.059722) = 0.942026.
    assert recommended["goodput"] == pytest.approx(0.942026, abs=1e-6)


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = _run(["plan", *argv, "--json"], capsys)
    assert code == 0, err
    return dict(json.loads(out))


def test_days_are_optional_and_take_units(capsys: pytest.CaptureFixture[str]) -> None:
    without = _json(["--failures-per-day", "8.6", "--interval", "2h"], capsys)
    assert without["failure_probability"] is None and without["expected_failures"] is None
    # 2 h intervals, 8.6 failures a day, free checkpoints: 1st order 1 - (1 h x 8.6)/24 h = 0.641667.
    assert without["rows"][0]["goodput_first_order"] == pytest.approx(0.641667, abs=1e-6)
    in_days = _json(["--failures-per-day", "8.6", "--interval", "2h", "--days", "1.5"], capsys)
    in_hours = _json(["--failures-per-day", "8.6", "--interval", "2h", "--days", "36h"], capsys)
    # 8.6 x 1.5 = 12.9 failures expected; P = 1 - e^-12.9.
    assert in_hours["expected_failures"] == pytest.approx(12.9)
    assert in_days["failure_probability"] == in_hours["failure_probability"]
    assert in_days["rows"] == in_hours["rows"] == without["rows"]
    code, out, _ = _run(["plan", "--failures-per-day", "8.6", "--interval", "2h"], capsys)
    assert code == 0 and "give --days" in out


def test_an_observed_rate_scales_to_another_job_size(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _json(["--failures-per-day", "8.6", "--observed-gpus", "16384", "--gpus", "512"], capsys)
    # 8.6 a day on 16384 GPUs is 8.6 x 512 / 16384 = 0.26875 a day on 512: MTBF 24 h / 0.26875 = 89.3023 h.
    assert plan["inputs"]["failures_per_day"] == pytest.approx(0.26875)
    assert plan["mtbf_hours"] == pytest.approx(89.3023, abs=1e-4)
    code, out, _ = _run(
        ["plan", "--failures-per-day", "8.6", "--observed-gpus", "16384", "--gpus", "512"], capsys
    )
    assert code == 0 and "observed on 16384 GPUs, scaled to 512 GPUs" in out


def test_a_first_order_goodput_below_zero_is_not_a_percentage(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--gpus", "8", "--afr", "0.01", "--interval", "1s", "1h", "--ckpt-stall", "20s"]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    one_second = next(line for line in out.splitlines() if line.strip().startswith("1s "))
    assert "n/a (saves queue)" in one_second and "-" not in one_second.replace("n/a", "")


def test_a_reader_that_goes_away_is_no_traceback() -> None:
    """`goodput plan ... | head -1`: the pipe closes before the table is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "goodput", "plan", "--failures-per-day", "8.6", "--interval", "2h"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and err == ""
