"""Hugging Face Trainer through goodput: a tiny GPT-2 (from a config, AdamW, a cosine schedule) on 2 ranks under
``goodput launch`` is SIGKILLed, resumes mid-epoch from goodput's data position without replaying a batch, and
writes a ledger; ``goodput verify-resume`` checks the script (its interrupted run is the launch the other
checks read)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from goodput.verify.records import read_records
from tests.helpers.commands import (
    Verified,
    assert_identical_after_two_kills,
    report_json,
    verify_resume_two_kills,
)
from tests.helpers.history import assert_exactly_once, attempts_seen, surviving_samples
from tests.helpers.paths import script

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

SCRIPT = script("hf_train.py")
STEPS, DATASET, PER_STEP = 12, 48, 8  # 2 ranks x batch 4: 6 steps per epoch


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> Verified:
    """``goodput verify-resume`` on the script, 2 ranks: seed 1 kills rank 0 at step 8 before that step's
    checkpoint is whole, and rank 1 between the Trainer's write of the step-8 checkpoint and goodput's data
    position beside it (that checkpoint is then not resumed from): both restarts resume from step 4. Its
    verdict and its work folder, whose interrupted run the tests here read (each process start costs seconds
    of imports: the tests share one run rather than launch their own)."""
    return verify_resume_two_kills(tmp_path_factory, SCRIPT, STEPS)


@pytest.mark.slow
def test_hf_trainer_resumes_mid_epoch_with_exactly_once_data(
    verified: Verified,
) -> None:
    proc, work = verified
    run_dir = os.path.join(work, "interrupted")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_exactly_once(surviving_samples(run_dir, 2, STEPS), DATASET, DATASET // PER_STEP)
    assert attempts_seen(run_dir) == {0, 1, 2}
    data = report_json(run_dir)
    assert data["restarts"] == 2 and data["failures"] == 2
    assert data["attempts"][-1]["restored_step"] == 4 and data["attempts"][-1]["last_step"] == STEPS
    assert data["categories"]["checkpoint_stall"] > 0 and data["categories"]["lost_work"] > 0
    # each resume's restore, from the Trainer's model load to its first hook, and where it came from
    assert data["categories"]["checkpoint_restore"] > 0
    assert data["restores_by_tier"]["durable"]["count"] == 2
    listing = subprocess.run(
        [sys.executable, "-m", "goodput", "ls", os.path.join(run_dir, "out"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)["checkpoints"]
    assert [(r["step"], r["status"], r["strategy"]) for r in rows] == [
        (step, "committed", "hf_trainer") for step in (12, 8, 4)
    ]


@pytest.mark.slow
def test_verify_resume_checks_a_trainer_script(
    verified: Verified,
) -> None:
    proc, work = verified
    assert_identical_after_two_kills(proc)
    final = read_records(os.path.join(work, "interrupted")).final
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
