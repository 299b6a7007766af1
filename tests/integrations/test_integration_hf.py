"""Hugging Face Trainer through goodput: a tiny GPT-2 (from a config, AdamW, a cosine schedule) under
``goodput launch`` is SIGKILLed, resumes mid-epoch from goodput's data position without replaying a batch, and
writes a ledger; ``goodput verify-resume`` checks the script on 2 ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from goodput.verify.records import read_records
from tests.helpers.history import assert_exactly_once, attempts_seen, surviving_samples
from tests.helpers.paths import script

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

SCRIPT = script("hf_train.py")
STEPS, DATASET, BATCH = 16, 48, 4  # 12 steps per epoch


@pytest.mark.slow
def test_hf_trainer_resumes_mid_epoch_with_exactly_once_data(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    command = ["launch", "--max-restarts", "2", "--run-dir", run_dir, "--faults", "kill@step=7"]
    proc = subprocess.run(
        [sys.executable, "-m", "goodput", *command, "--", SCRIPT, str(STEPS)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert_exactly_once(surviving_samples(run_dir, 1, STEPS), DATASET, DATASET // BATCH)
    assert attempts_seen(run_dir) == {0, 1}
    report = subprocess.run(
        [sys.executable, "-m", "goodput", "report", run_dir, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert data["restarts"] == 1 and data["failures"] == 1
    assert data["attempts"][-1]["restored_step"] == 4 and data["attempts"][-1]["last_step"] == STEPS
    assert data["categories"]["checkpoint_stall"] > 0 and data["categories"]["lost_work"] > 0
    listing = subprocess.run(
        [sys.executable, "-m", "goodput", "ls", os.path.join(run_dir, "out"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)["checkpoints"]
    assert [(r["step"], r["status"], r["strategy"]) for r in rows] == [
        (step, "committed", "hf_trainer") for step in (16, 12, 8, 4)
    ]


@pytest.mark.slow
def test_verify_resume_checks_a_trainer_script(tmp_path: os.PathLike[str]) -> None:
    # seed 1 kills rank 0 after step 8 and rank 1 between the Trainer's write of a checkpoint and goodput's
    # data position beside it (that checkpoint is then not resumed from)
    command = ["verify-resume", "--nproc", "2", "--kills", "2", "--seed", "1", "--work-dir", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "goodput", *command, "--", SCRIPT, "12"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "IDENTICAL" in proc.stdout and "after 2 restarts (2 kills fired)" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    final = read_records(os.path.join(tmp_path, "interrupted")).final
    assert sorted(final) == [0, 1] and "scheduler.last_epoch" in final[0]["state"]
    assert any(name.endswith(".exp_avg") for name in final[0]["state"])  # AdamW's moments were compared


def test_bench_data_measures_the_trainer_resume(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from goodput.bench import data

    parser = argparse.ArgumentParser()
    data.add_arguments(parser)
    args = parser.parse_args(
        ["--steps", "2", "--compute", "1ms", "--repeats", "1", "--hf-resume-at", "8000", "--json"]
    )
    assert data.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    hf = report["resume_hf"]
    assert hf["position"] == 8000 and hf["batch"] == 8
    assert (
        report["ratios"]["hf_skip_resume_over_goodput_resume"]
        == hf["hf_skip_seconds"] / hf["goodput_seconds"]
    )
