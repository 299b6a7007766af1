"""The error file of a hot spare names the rank it took, not the one its process had when it started.

``Run`` installs the excepthook that writes torch's error file when the process starts, before a spare is
handed a rank (and a shrink or grow may renumber a survivor later). Real processes: rank 1 is SIGKILLed, the
spare takes rank 1, and after training it raises an uncaught error. And a rank's own failure is in its ledger
before it is reported (in one process).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from typing import Any

import pytest
import torch

import goodput as gp
from goodput.errors import NumericFault
from goodput.job.folder import last_error
from goodput.ledger.ledger import read_events
from tests.helpers.launching import SCRIPTS, warm_launch

SCRIPT = os.path.join(SCRIPTS, "late_error_train.py")


@pytest.mark.slow
def test_a_spare_that_took_rank_1_names_rank_1_in_its_error_file(tmp_path: Any) -> None:
    run_dir = str(tmp_path / "run")
    # killed late enough for the node's spare (forked from its template) to be ready: on a loaded machine an
    # early kill is handed to a process started for the rank instead, whose RANK is right from its start
    cmd = [*warm_launch(run_dir), "--faults", "kill@step=150,rank=1", "--", SCRIPT, "--steps", "200"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert "warm hand-over to" in proc.stderr, proc.stderr[-3000:]  # another process took rank 1
    files = glob.glob(os.path.join(run_dir, "launches", "*", "logs", "**", "error.json"), recursive=True)
    found = []
    for path in files:
        with open(path) as f:
            message = json.load(f)["message"]
        if "late error after training" in message["message"]:
            found.append((path, message["extraInfo"]["goodput_rank"]))
    assert len(found) == 1, (files, proc.stderr[-3000:])
    path, rank = found[0]
    assert rank == "1", found  # written by the process that took rank 1 (a spare: logs/spare<N>), naming it
    launch = os.path.dirname(path.split(f"{os.sep}logs{os.sep}")[0] + f"{os.sep}logs")
    quoted = last_error(launch)
    assert quoted is not None and quoted.startswith("rank 1: RuntimeError: late error"), quoted


class _Exited(Exception):
    pass


def test_a_ranks_own_failure_is_in_its_ledger_on_disk_before_it_is_reported(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank's own failure under warm restarts (``exit_failed``) is reported as the excepthook would; for a
    numeric stop or an error no restart fixes, that report is a marker on which the launcher ends every rank, so
    the rank's ``failure_detected`` and ``attempt_end`` must be on disk when the report is made. The real report
    runs; the process's exit at the end is the one part replaced (it would end pytest)."""
    import goodput.run._warm as warm

    seen_at_report: list[list[str]] = []
    real = warm.report_failure

    def report(rank: int, err: BaseException, **kwargs: Any) -> str:
        seen_at_report.append([e["event"] for e in read_events(str(tmp_path), rank=0)])
        return real(rank, err, **kwargs)

    def exit_now(code: int) -> None:
        raise _Exited(code)

    monkeypatch.setattr(warm, "report_failure", report)
    monkeypatch.setattr(warm.os, "_exit", exit_now)
    run = gp.Run(str(tmp_path), total_steps=4, hang_timeout=None, progress=False)
    run.restore(model=torch.nn.Linear(1, 1))
    run.step_done(loss=1.0)
    with pytest.raises(_Exited):
        warm.exit_failed(run, NumericFault("step 2: the loss is nan on rank 0"), planned=True)
    (seen,) = seen_at_report
    assert seen[-2:] == ["failure_detected", "attempt_end"], seen
    events = read_events(str(tmp_path), rank=0)
    assert events[-2]["reason"] == "exception on this rank: step 2: the loss is nan on rank 0", events[-2]
