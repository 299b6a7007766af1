"""The report: planner prediction from measured figures, advice for the situations it targets, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from goodput import planning
from goodput.cli import main
from goodput.ledger.report import build_report
from tests.helpers.ledgers import synthetic_run, write_run


def _events(**kwargs: Any) -> list[dict[str, Any]]:
    return [e for a in synthetic_run(**kwargs) for e in a.events]


def _kinds(**kwargs: Any) -> dict[str, Any]:
    return {a.kind: a for a in build_report(_events(**kwargs)).advice}


def test_prediction_uses_the_measured_figures() -> None:
    """Steps of 0.5 s, a save every 600 steps (300 s of compute), C 8 s, W 2 s, two crashes, restart cost
    = 20 s downtime + 6 s init + 4 s restore = 30 s, no detection delay, MTBF = wall / 2."""
    report = build_report(_events())
    acc, pred = report.accounting, report.prediction
    assert acc.failures == 2 and pred.mtbf_source == "observed"
    assert pred.mtbf_seconds == pytest.approx(acc.wall_seconds / 2)
    assert pred.interval_seconds == pytest.approx(300.0)
    costs = planning.Costs(ckpt_stall=8.0, mtbf=acc.wall_seconds / 2, restart=30.0, persist=2.0, detect=0.0)
    expected = planning.goodput_daly(300.0, costs)
    assert pred.planner_goodput == pytest.approx(expected, rel=1e-6)
    best = planning.optimal_interval(costs)
    assert pred.optimal_interval_seconds == pytest.approx(best, rel=1e-6)
    # the planner's time starts after the first attempt's init (6 s); the clean end (1 s, other) it does not model
    assert pred.modelled_share == pytest.approx(1.0 - 6.0 / acc.wall_seconds, rel=1e-6)
    assert pred.unmodelled_share == pytest.approx(1.0 / acc.wall_seconds, rel=1e-6)
    assert pred.predicted_goodput == pytest.approx(expected * pred.modelled_share - 1.0 / acc.wall_seconds)


def test_prediction_without_failures_needs_an_assumed_mtbf() -> None:
    events = _events(crashes=())
    plain = build_report(events).prediction
    assert plain.mtbf_source == "none" and plain.optimal_interval_seconds is None
    assert plain.planner_goodput == pytest.approx(300.0 / 308.0)  # no failures: tau / (tau + C)
    assumed = build_report(events, mtbf=3600.0).prediction
    assert assumed.mtbf_source == "assumed" and assumed.optimal_interval_seconds is not None


def test_interval_advice_when_far_from_the_optimum() -> None:
    far = _kinds(every_steps=600, crashes=(700.0, 1500.0))  # 300 s against an optimum near 130 s
    assert far["interval"].gain_points > 0
    assert "longer than the optimum" in far["interval"].text
    near = build_report(_events(every_steps=260)).prediction  # 130 s
    assert near.interval_seconds is not None and near.optimal_interval_seconds is not None
    assert 0.5 < near.interval_seconds / near.optimal_interval_seconds < 2.0
    assert "interval" not in _kinds(every_steps=260)


def test_a_trainer_run_is_advised_in_save_steps() -> None:
    """The Hugging Face Trainer's save_steps sets its interval: goodput's every= does not apply there."""
    far = _kinds(every_steps=600, crashes=(700.0, 1500.0), strategy="hf_trainer")["interval"]
    best = build_report(_events(every_steps=600, strategy="hf_trainer")).prediction.optimal_interval_seconds
    assert best is not None
    assert (
        far.text.startswith("save_steps=600 (a checkpoint every 5.0m)")
        and "longer than the optimum" in far.text
    )
    assert far.text.endswith(f"set save_steps={round(best / 0.5)} in TrainingArguments"), far.text
    assert "every=" not in far.text and far.gain_points > 0


def test_async_advice_for_a_blocking_strategy_only() -> None:
    sync = _kinds(strategy="torch_save", stall=30.0)
    assert sync["async"].gain_points > 0 and "dcp_async" in sync["async"].text
    assert "async" not in _kinds(strategy="dcp_async", stall=30.0)
    assert "async" in _kinds(strategy=None, stall=30.0, persist=0.0)  # no overlap seen: blocking


def test_data_wait_advice_above_a_few_percent() -> None:
    slow = _kinds(fetch_seconds=0.1)
    assert "num_workers" in slow["data_wait"].text and slow["data_wait"].upper_bound
    assert slow["data_wait"].gain_points == pytest.approx(20.0, abs=1.0)  # 0.1 of every 0.5 s step
    assert "data_wait" not in _kinds(fetch_seconds=0.005)


def test_cold_cache_advice() -> None:
    cold = ({"epoch": 0, "hits": 0, "misses": 100}, {"epoch": 1, "hits": 5, "misses": 95})
    assert "cold every epoch" in _kinds(cache_stats=cold, fetch_seconds=0.1)["cold_cache"].text
    warm = ({"epoch": 0, "hits": 0, "misses": 100}, {"epoch": 1, "hits": 97, "misses": 3})
    assert "cold_cache" not in _kinds(cache_stats=warm, fetch_seconds=0.1)


def test_state_advice_names_what_is_missing() -> None:
    missing = _kinds(keys=("model", "optimizer"))
    assert missing["state_data"].gain_points is None and "state_rng" in missing
    assert not {"state_data", "state_rng"} & set(_kinds())
    assert not {"state_data", "state_rng"} & set(_kinds(keys=None))  # not declared: no claim either way


def test_restart_advice_when_restarts_cost_more_than_the_interval_wastes() -> None:
    costly = _kinds(every_steps=60, stall=1.0, downtime=200.0)  # 30 s interval, 210 s restarts
    assert costly["restart"].gain_points > 0 and "each restart costs" in costly["restart"].text
    assert "restart" not in _kinds(every_steps=60, stall=1.0, downtime=1.0)


def test_no_checkpoint_advice() -> None:
    advice = _kinds(every_steps=10**9)
    assert advice["no_checkpoint"].gain_points > 0


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run", synthetic_run(fetch_seconds=0.05))


def test_cli_table(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    for needle in ("productive", "lost_work", "goodput (measured)", "goodput (predicted)", "MTBF", "advice:"):
        assert needle in out


def test_cli_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["restarts"] == 2
    assert sum(data["categories"].values()) == pytest.approx(data["wall_seconds"])
    assert data["goodput"] == pytest.approx(data["categories"]["productive"] / data["wall_seconds"])
    assert 0.0 < data["predicted_goodput"] < 1.0


def test_cli_plot(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import matplotlib.image

    png = tmp_path / "report.png"
    assert main(["report", str(run_dir), "--plot", str(png), "--window", "2m"]) == 0
    pixels = matplotlib.image.imread(str(png))
    productive_green = (pixels[:, :, 0] < 0.25) & (pixels[:, :, 1] > 0.55) & (pixels[:, :, 2] < 0.25)
    assert productive_green.sum() > 10_000  # the timeline is drawn, mostly productive


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "/nonexistent/run"], "is not a folder"),
        (["report", "{tmp}"], "has no ledger"),
        (["report", "{run}", "--mtbf", "6"], "needs a number and a unit"),
        (["report", "{run}", "--plot", "/nonexistent/x.png"], "does not exist"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(
    argv: list[str], message: str, run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.format(tmp=tmp_path / "empty", run=run_dir) for a in argv]
    (tmp_path / "empty").mkdir()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_entry_point_error_has_no_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "goodput", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "has no ledger" in done.stderr


def test_data_wait_advice_for_a_cached_run_does_not_say_enable_the_cache() -> None:
    warm = ({"epoch": 0, "hits": 0, "misses": 100}, {"epoch": 1, "hits": 97, "misses": 3})
    text = _kinds(cache_stats=warm, fetch_seconds=0.1)["data_wait"].text
    assert "enable the local cache" not in text and "prefetch_bytes" in text
    assert "enable the local cache" in _kinds(fetch_seconds=0.1)["data_wait"].text


def test_other_advice_when_time_outside_steps_is_large() -> None:
    """Process start 0, attempt start 1; 20 steps of 1 s each followed by 1 s of eval outside the loop
    (steps at 2k+1..2k+2): other = 20 x 1 s minus nothing else = 20 s of a 41 s wall (48.8%)."""
    from tests.helpers.ledgers import Attempt

    a = Attempt(0, process_start=0.0, start=1.0)
    for k in range(20):
        a.step(k + 1, 2 * k + 1.0, 2 * k + 2.0).add("eval", 2 * k + 3.0, seconds=1.0)
    a.add("attempt_end", 41.0, status="ok")
    report = build_report(a.events)
    other = {x.kind: x for x in report.advice}["other"]
    assert other.gain_points == pytest.approx(100 * 20 / 41, abs=1e-6) and other.upper_bound
    assert "other is 48.8% of wall time" in other.text and "eval 20" in other.text
    assert "other" not in _kinds()  # the synthetic run's steps follow each other
