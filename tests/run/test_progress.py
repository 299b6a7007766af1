"""The live progress line over a real ledger, and the optional exporters."""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

import goodput as gp
from goodput import ConfigError, Ledger, MLflowExporter, TensorBoardExporter
from goodput.run.progress import Progress
from tests.scripts._readme_loop import fit


class _Recorder:
    """An exporter that keeps what it is given (the exporter seam, not the thing under test)."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.closed = False

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.logged.append((step, dict(metrics)))

    def close(self) -> None:
        self.closed = True


def _busy(n: int) -> int:
    return sum(range(n))


def test_progress_shows_step_loss_fetch_and_live_goodput(tmp_path: Path) -> None:
    out, recorder = io.StringIO(), _Recorder()
    with (
        Ledger(tmp_path) as ledger,
        Progress(10, ledger=ledger, file=out, mininterval=0, exporters=[recorder]) as bar,
    ):
        for step in range(1, 6):
            ledger.step_start(step)
            _busy(200_000)
            ledger.step_end(step, fetch_seconds=0.002)
            bar.update(step, loss=2.5 / step)
        line = bar.last_line
        # In a long test session the process started long ago, so the share is small but above zero.
        live = ledger.live_goodput
    assert line.startswith("step 5 | loss 0.5 | fetch 2ms | goodput ")
    assert 0.0 < live < 1.0  # steps did run, and process start (imports) came before them
    shown = float(line.rsplit(" ", 1)[1].rstrip("%"))
    assert shown == pytest.approx(100 * live, abs=0.1)
    assert "5/10" in out.getvalue()
    assert [s for s, _ in recorder.logged] == [1, 2, 3, 4, 5]
    assert recorder.logged[-1][1]["fetch_seconds"] == pytest.approx(0.002)
    assert recorder.logged[-1][1]["loss"] == pytest.approx(0.5)
    assert recorder.closed


def test_progress_is_silent_off_rank_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    out = io.StringIO()
    with Progress(3, file=out, mininterval=0) as bar:
        bar.update(1, loss=1.0)
    assert out.getvalue() == ""
    with pytest.raises(ConfigError, match="total"):
        Progress(-1)


def test_tensorboard_exporter_names_the_missing_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an environment without it looks like
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        TensorBoardExporter(str(tmp_path))


def test_mlflow_exporter_names_the_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ConfigError, match="pip install mlflow"):
        MLflowExporter()


def test_tensorboard_exporter_writes_scalars(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    exporter = TensorBoardExporter(str(tmp_path))
    for step in range(3):
        exporter.log(step, {"goodput": 0.5 + step / 10, "fetch_seconds": 0.01})
    exporter.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [round(e.value, 3) for e in events.Scalars("goodput/goodput")] == [0.5, 0.6, 0.7]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_file_gets_plain_periodic_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    out = io.StringIO()  # not a terminal, as a redirected stdout or a batch job's log
    with Progress(200, file=out, mininterval=0, log_interval=3600) as bar:
        for step in range(1, 201):
            bar.update(step, loss=1.0 / step)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 2  # the first step, then (within the hour) only the last at close
    assert lines[0].startswith("step 1/200 | loss 1 | ") and lines[1].startswith(
        "step 200/200 | loss 0.005 | "
    )
    every = io.StringIO()
    with Progress(5, file=every, mininterval=0, log_interval=0) as bar:
        for step in range(1, 6):
            bar.update(step)
    assert [line.split(" | ")[0] for line in every.getvalue().splitlines()] == [
        f"step {s}/5" for s in range(1, 6)
    ]


def test_a_terminal_gets_the_redrawn_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    out = _Terminal()
    with Progress(3, file=out, mininterval=0) as bar:
        for step in range(1, 4):
            bar.update(step)
    assert "\r" in out.getvalue() and "3/3" in out.getvalue()


def test_steps_between_draws_are_not_formatted_but_the_last_one_is_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    out = io.StringIO()
    with Progress(300, file=out, mininterval=3600, log_interval=0) as bar:  # one draw an hour at most
        for step in range(1, 301):
            bar.update(step, loss=1.0 / step)
        assert bar.last_line.startswith("step 1 |")  # formatted at the first step only
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 1/300 | loss 1 | ")
    assert lines[-1].startswith("step 300/300 | loss 0.003333 | ")  # close draws the last step held


def test_after_a_rollback_the_live_goodput_goes_on_in_the_new_attempt(tmp_path: Path) -> None:
    """A rollback opens a new ledger attempt in the same process: the progress line and the exporters read it,
    not the first attempt's closed one, and it goes on from the process's totals (docs/integrations.md)."""
    recorder = _Recorder()
    config = gp.CheckpointConfig(
        root=str(tmp_path / "ckpt"),
        strategy="torch_save",
        every=1000,
        memory=gp.MemoryTier(every=1, keep=2, folder=str(tmp_path / "ram")),
    )
    run = gp.Run(str(tmp_path / "run"), total_steps=40, checkpoint=config, numeric=gp.NumericConfig(),
                 faults="nan@step=3", hang_timeout=None, progress=False, exporters=[recorder])  # fmt: skip
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = gp.ResumableLoader(torch.randn(400, 4), batch_size=4, seed=0)
    run.restore(model=model, optimizer=opt, loader=loader)

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)  # the step's compute: what live goodput counts
        return model(batch).pow(2).mean()

    fit(run, loader, loss_of, opt)
    events = gp.read_events(str(tmp_path / "run"))
    assert [e["event"] for e in events if e["event"] == "rollback"] == ["rollback"]
    after = [metrics for _, metrics in recorder.logged[-30:]]
    # 30 steps of 20 ms compute each: the live figure rises (the process's goodput so far, which began with the
    # pytest worker, is far below a step's own share); the closed attempt's could only fall, its compute frozen
    for name in ("goodput", "capacity_goodput"):
        assert after[-1][name] > after[0][name] > 0, [m[name] for m in after]
