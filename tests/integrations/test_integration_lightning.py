"""Lightning through goodput: a LightningModule with AdamW and an LR schedule under ``goodput launch`` (2 ranks,
gloo, DDP) survives SIGKILLs, resumes mid-epoch with its optimizer and scheduler, trains on every sample exactly
once per epoch and ends with the weights, optimizer state and learning rate of an uninterrupted run;
``goodput report`` reads its ledger and ``goodput verify-resume`` checks the script.

One ``goodput verify-resume`` (an uninterrupted launch and one with two SIGKILLs) is the run every slow test
here reads: each Lightning process start costs seconds of imports, so the tests share it rather than launch
their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest
import torch

from tests.helpers.commands import (
    Verified,
    assert_identical_after_two_kills,
    report_json,
    verify_resume_two_kills,
)
from tests.helpers.history import assert_exactly_once, attempts_seen, surviving_samples
from tests.helpers.paths import script

pytest.importorskip("lightning")

SCRIPT = script("lightning_train.py")
STEPS, DATASET, PER_STEP = 20, 64, 8  # 2 ranks x batch 4: 8 steps per epoch


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> Verified:
    """``goodput verify-resume`` on the script (seed 1 kills rank 0 after step 12, rank 1 inside the write of
    step 16): its verdict, and its work folder, whose uninterrupted run is the reference of the tests here."""
    return verify_resume_two_kills(tmp_path_factory, SCRIPT, STEPS)


def _final(run_dir: str, rank: int) -> dict[str, Any]:
    final: dict[str, Any] = torch.load(os.path.join(run_dir, f"final-rank{rank}.pt"), weights_only=True)
    return final


def _assert_same_final(reference_dir: str, run_dir: str) -> None:
    """Both ranks end with the same weights, optimizer state (AdamW moments, step) and learning rate, bitwise."""
    for rank in (0, 1):
        ref, got = _final(reference_dir, rank), _final(run_dir, rank)
        assert got["lr"] == ref["lr"], (
            f"rank {rank}: lr {got['lr']} after the kills, {ref['lr']} uninterrupted"
        )
        assert ref["lr"] < 0.01  # the schedule moved it
        for name, tensor in ref["model"].items():
            assert torch.equal(got["model"][name], tensor), f"rank {rank}: {name} differs"
        ref_state, got_state = ref["optimizer"]["state"], got["optimizer"]["state"]
        assert sorted(got_state) == sorted(ref_state) and ref_state
        for index, moments in ref_state.items():
            for key, value in moments.items():
                assert torch.equal(got_state[index][key], value), (
                    f"rank {rank}: optimizer {index}.{key} differs"
                )


@pytest.mark.slow
def test_lightning_ddp_survives_sigkills_with_exactly_once_data(
    verified: Verified,
) -> None:
    """The interrupted run of ``verified`` (one ``goodput launch`` of 3 attempts): rank 0 dies mid-epoch 1
    after step 12, rank 1 inside the write of step 16, so that save is never committed and the last attempt
    falls back to step 12."""
    proc, work = verified
    run_dir = os.path.join(work, "interrupted")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_exactly_once(surviving_samples(run_dir, 2, STEPS), DATASET, DATASET // PER_STEP)
    assert attempts_seen(run_dir) == {0, 1, 2}  # the killed attempts' lost steps were really redone
    data = report_json(run_dir)
    assert data["restarts"] == 2 and data["failures"] == 2
    assert data["info"]["checkpoint_config"] == {"strategy": "dcp", "every_steps": 4}
    assert data["categories"]["checkpoint_stall"] > 0 and data["categories"]["checkpoint_restore"] > 0
    assert data["attempts"][-1]["restored_step"] == 12 and data["attempts"][-1]["last_step"] == STEPS
    with open(os.path.join(run_dir, "output.log"), errors="replace") as f:
        output = f.read()  # every line of the workers and torchrun (verify-resume launches with --verbose)
    assert "`weights_only` was not set" not in output  # Lightning's note on every save


@pytest.mark.slow
def test_verify_resume_checks_a_lightning_script(
    verified: Verified,
) -> None:
    proc, work = verified
    assert_identical_after_two_kills(proc)
    _assert_same_final(os.path.join(work, "uninterrupted"), os.path.join(work, "interrupted"))


def test_a_trainer_that_would_not_save_through_goodput_is_refused(tmp_path: os.PathLike[str]) -> None:
    import lightning.pytorch as pl
    import torch

    import goodput as gp
    from goodput.integrations.lightning import GoodputCallback

    class Small(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.net(batch).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def cpu_trainer(goodput_cb: GoodputCallback, **plugins: Any) -> pl.Trainer:
        options = {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": 2,
            "logger": False,
            "enable_progress_bar": False,
        }
        return pl.Trainer(callbacks=[goodput_cb], **options, **plugins)

    goodput_cb = GoodputCallback(str(tmp_path), loader=gp.ResumableLoader(torch.ones(8, 2), batch_size=2))
    with pytest.raises(gp.ConfigError, match="does not save through goodput"):
        cpu_trainer(goodput_cb).fit(Small(), train_dataloaders=goodput_cb.loader)
    # Lightning's single-device strategy would restore before creating the optimizer: refused up front
    goodput_cb = GoodputCallback(str(tmp_path), loader=gp.ResumableLoader(torch.ones(8, 2), batch_size=2))
    trainer = cpu_trainer(goodput_cb, plugins=[goodput_cb.checkpoint_io])
    with pytest.raises(gp.ConfigError, match="restores a checkpoint before it creates the optimizers"):
        trainer.fit(Small(), train_dataloaders=goodput_cb.loader)
    goodput_cb.ledger.close()


@pytest.mark.slow
def test_a_lightning_fit_resumed_after_a_failed_save_and_after_its_end_numbers_steps_as_its_data(
    tmp_path: os.PathLike[str],
) -> None:
    """A fit whose save of step 8 fails is told, in Lightning's terms, how to resume (not ``close(step=8)``, a
    ``goodput.Run`` call); fit again, it resumes from step 4 to its ``max_steps=9``; fit again with
    ``max_steps=14``, it goes on from step 9, the fourth batch of epoch 1, and Lightning numbers every epoch and
    batch as the data are (6 batches an epoch), so its progress bar reads as the run is."""
    run_dir = str(tmp_path)
    env = {**os.environ, "GOODPUT_RUN_DIR": run_dir, "GOODPUT_FAULTS": "raise@phase=checkpoint_write,step=8"}

    def fit(max_steps: int) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, script("lightning_resume.py"), str(max_steps)]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)

    failed = fit(9)
    assert failed.returncode != 0 and "injected fault" in failed.stderr, failed.stderr[-3000:]
    assert "close(step=" not in failed.stderr
    assert "fit failed after step 8, which no checkpoint holds (newest: step 4)" in failed.stderr
    assert "ckpt_path=goodput_cb.resume_path" in failed.stderr
    del env["GOODPUT_FAULTS"]
    for max_steps in (9, 14):
        proc = fit(max_steps)
        assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(run_dir, "batches.jsonl")) as f:
        batches = [json.loads(line) for line in f]
    # the failed attempt trained 1-8 (its save of 8 raised before step 8 was logged), resumed from 4, then 9
    assert [b["step"] for b in batches] == [*range(1, 8), *range(5, 15)]
    for b in batches:
        assert (b["epoch"], b["batch_idx"]) == divmod(b["step"] - 1, 6), b


def _batches(run_dir: str) -> list[dict[str, Any]]:
    with open(os.path.join(run_dir, "batches.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
@pytest.mark.parametrize("bar", ["tqdm", "rich"])
def test_a_lightning_progress_bar_resumed_mid_epoch_reads_as_an_uninterrupted_one(
    tmp_path: os.PathLike[str], bar: str
) -> None:
    """A user's fit with a progress bar and ``max_steps=10`` (6 batches an epoch, so ``max_steps`` cuts epoch 1
    to 4) is SIGKILLed in step 9 and resumed from step 8, mid-epoch 1, where Lightning runs no epoch-start hook
    (its bars take their length and "Epoch N" there): at every step the resumed bar reads as an uninterrupted
    fit's, not "Training 3/None" or "3/2"."""
    if bar == "rich":
        pytest.importorskip("rich")

    def fit(run_dir: str, faults: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "GOODPUT_FAULTS"}
        env.update({"GOODPUT_RUN_DIR": run_dir, **({"GOODPUT_FAULTS": faults} if faults else {})})
        cmd = [sys.executable, script("lightning_resume.py"), "10", bar]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)

    reference_dir, run_dir = os.path.join(tmp_path, "uninterrupted"), os.path.join(tmp_path, "interrupted")
    proc = fit(reference_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = {b["step"]: b for b in _batches(reference_dir)}
    killed = fit(run_dir, faults="kill@step=9")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before = len(_batches(run_dir))
    proc = fit(run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = _batches(run_dir)[before:]
    assert [b["step"] for b in resumed] == [9, 10]  # from the checkpoint of step 8 to max_steps
    assert reference[9]["batch_idx"] > 0 and reference[9]["bar"]  # a mid-epoch resume, a bar that shows
    for line in resumed:
        assert line == reference[line["step"]]
