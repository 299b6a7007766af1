"""goodput's own work after each step's end (the numeric guard's verdict, the straggler detector) is counted in
the ledger's ``other``; the run writes its time as ``post_step_checks`` events, so the report names it there instead
of leaving the user to guess what ``other`` holds."""

from __future__ import annotations

import os
from pathlib import Path

import torch

import goodput as gp
from goodput.ledger import read_events
from goodput.ledger.report import load_report
from goodput.run import _ending
from tests.scripts._readme_loop import fit


def test_the_checks_after_each_step_are_in_the_ledger_and_inside_other(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(_ending, "CHECKS_EVERY", 16)  # an event mid-run as well as at the end
    run_dir = str(tmp_path)
    config = gp.CheckpointConfig(root=os.path.join(run_dir, "ckpt"), strategy="torch_save", every=100)
    run = gp.Run(run_dir, total_steps=40, checkpoint=config, hang_timeout=None, progress=False, numeric=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = gp.ResumableLoader(torch.randn(320, 4), batch_size=8, seed=0)
    run.restore(model=model, optimizer=opt, loader=loader)
    # the README's loop: a step runs from its batch's wait to step_done()
    fit(run, loader, lambda batch: model(batch).pow(2).mean(), opt)
    checks = [e for e in read_events(run_dir, rank=0) if e["event"] == "post_step_checks"]
    assert [e["steps"] for e in checks] == [16, 16, 8]  # every step once: two due, the rest as the run ended
    seconds = sum(float(e["seconds"]) for e in checks)
    report = load_report(run_dir)
    assert 0 < seconds <= report.accounting.categories["other"]  # inside other, where the ledger puts it
    assert report.accounting.info["custom"]["post_step_checks"]["seconds"] == seconds
