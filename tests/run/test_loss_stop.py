"""The numeric guard is off by default, yet a non-finite loss is never trained on silently: the README's ``Run``
whose own data yields one NaN sample stops at that step with one line and EXIT_NUMERIC, and no checkpoint of the
NaN state is written, not even by the ``run.close()`` of a user's ``finally``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import goodput as gp
from goodput.checkpoint.durable.layout import CheckpointLayout
from goodput.errors import NumericFault
from goodput.job.codes import EXIT_NUMERIC
from goodput.ledger.ledger import read_events
from tests.helpers.launching import terminal_lines
from tests.helpers.paths import script

POISON = 130  # the dataset's NaN sample (numeric_train.py --poison)


def _committed(root: str) -> list[int]:
    return sorted(info.step for info in CheckpointLayout(root).scan() if info.status == "committed")


def _step_of(run_dir: str, sample: int) -> tuple[int, int]:
    """(step, rank) where ``sample`` was trained, from the script's own records."""
    for rank in range(2):
        with open(os.path.join(run_dir, f"samples-rank-{rank}.jsonl")) as f:
            for line in f:
                record = json.loads(line)
                if sample in record["indices"]:
                    return record["step"], rank
    raise AssertionError(f"sample {sample} was never trained")


@pytest.mark.slow
def test_a_nan_in_the_users_data_stops_the_launch_with_one_line_and_no_nan_checkpoint(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    command = [sys.executable, "-m", "goodput", "launch", "--nproc", "2", "--run-dir", run_dir, "--"]
    command += [script("numeric_train.py"), "--no-guard", "--poison", str(POISON), "--steps", "16"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == EXIT_NUMERIC, proc.stderr[-3000:]
    step, rank = _step_of(run_dir, POISON)
    shown = terminal_lines(proc.stdout + proc.stderr)
    assert len(shown) == 1, shown
    assert f"step {step}: the loss is nan on rank {rank}" in shown[0] and "numeric=True" in shown[0]
    assert f"exit {EXIT_NUMERIC}" in shown[0]
    # The other rank reached its save of that step (every 4), but nothing of it or later was committed.
    saved = _committed(os.path.join(run_dir, "checkpoints"))
    assert saved and max(saved) < step, saved
    flat = tmp_path / "newest.pt"
    dcp_to_torch_save(os.path.join(run_dir, "checkpoints", f"step-{max(saved)}"), flat)
    params = {k: v for k, v in torch.load(flat, weights_only=False)["model"].items() if torch.is_tensor(v)}
    assert params and all(bool(torch.isfinite(v).all()) for v in params.values())
    (stop,) = [e for e in read_events(run_dir, rank=rank) if e["event"] == "numeric_stop"]
    assert stop["line"] in shown[0]


def test_close_after_the_stop_saves_nothing(tmp_path: Path) -> None:
    """One process, a checkpoint every step: the step with the NaN loss raises NumericFault, and the
    ``run.close()`` of the user's ``finally`` saves nothing after it."""
    root = str(tmp_path / "checkpoints")
    run = gp.Run(
        str(tmp_path), total_steps=8, checkpoint=gp.CheckpointConfig(root=root, strategy="dcp", every=1),
        hang_timeout=None, progress=False,
    )  # fmt: skip
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rows = torch.ones(16, 2)
    rows[9] = float("nan")  # its step (in the order of seed 0) is the first with a NaN loss
    loader = gp.ResumableLoader(torch.utils.data.TensorDataset(rows), batch_size=2, seed=0)
    run.restore(model=model, optimizer=opt, loader=loader)
    losses: list[float] = []
    with pytest.raises(NumericFault) as stop:
        try:
            for (batch,) in run.batches(loader):
                loss = model(batch).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
                run.step_done(loss=losses[-1])
        finally:
            run.close()
    bad = next(i + 1 for i, x in enumerate(losses) if not math.isfinite(x))
    assert bad == len(losses) and f"step {bad}: the loss is nan on rank 0" in str(stop.value)
    assert max(_committed(root)) == bad - 1  # saved every step up to the one before, none after


def test_the_stop_is_in_the_ledger_on_disk_before_the_launcher_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report is what makes the launcher end every rank: this rank's ``numeric_stop`` must already be on
    disk then, or that kill can lose it. The real report runs; the test reads the files at its call."""
    import goodput.run.numeric.loss_stop as loss_stop

    seen_at_report: list[list[str]] = []
    real = loss_stop.report_failure

    def report(rank: int, err: BaseException, **kwargs: object) -> str:
        seen_at_report.append([e["event"] for e in read_events(str(tmp_path), rank=0)])
        return real(rank, err, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loss_stop, "report_failure", report)
    run = gp.Run(str(tmp_path), total_steps=4, hang_timeout=None, progress=False)
    run.restore(model=torch.nn.Linear(1, 1))
    with pytest.raises(NumericFault):
        run.step_done(loss=1.0)
        run.step_done(loss=float("inf"))
    run.close()
    (seen,) = seen_at_report
    assert seen[-2:] == ["numeric_fault", "numeric_stop"], seen
