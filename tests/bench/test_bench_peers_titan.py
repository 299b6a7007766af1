"""`goodput bench peers`: the held-out slice every row is scored on, and the titan contender (torchtitan's own
checkpointer) through one SIGKILL of rank 0 once it has trained 20 steps.

The held-out samples are in no contender's data: checked against the loaders the contenders build (the
baseline's and titan's ``DistributedSampler`` order on each rank, goodput's own loader), not against the split's
own bookkeeping; and the loss is the one a model gets on exactly those samples of the corpus.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from goodput.bench._peers_baseline import demo_loader
from goodput.bench._peers_count import exactness, read_records
from goodput.bench._peers_faults import _holder
from goodput.bench._peers_heldout import HELDOUT, heldout_loss, write_split
from goodput.data import ResumableLoader, ShardedDataset
from goodput.demo.corpus import corpus_bytes, samples
from goodput.demo.model import ModelConfig, TinyLM
from goodput.demo.prepare import SAMPLE_BYTES
from goodput.demo.train import collate, decode, save_final_model
from goodput.job.signals import descendants
from goodput.ledger import read_events

LIMIT = 200_000  # bytes of corpus: 3,076 samples, the last 1,024 held out


def _ids(loader) -> list[int]:
    return [i for indices, _ in loader for i in indices]


def test_no_contender_s_loader_yields_a_held_out_sample(tmp_path) -> None:
    data, heldout = write_split(str(tmp_path), limit=LIMIT)
    corpus = len(samples(corpus_bytes(LIMIT), SAMPLE_BYTES))
    held = [ShardedDataset(heldout, decode=decode)[i][0] for i in range(HELDOUT)]
    assert held == list(range(corpus - HELDOUT, corpus))  # the corpus's last samples, by their corpus ids
    dataset = ShardedDataset(data, decode=decode)
    args = argparse.Namespace(batch_size=16, workers=0)
    trained: list[int] = []
    for rank in (0, 1):  # the baseline's and titan's order (bench/_peers_baseline.py demo_data)
        sampler = torch.utils.data.distributed.DistributedSampler(
            dataset, num_replicas=2, rank=rank, shuffle=False, drop_last=True
        )
        trained += _ids(demo_loader(dataset, sampler, args))
    goodput = ResumableLoader(dataset, batch_size=16, seed=0, collate_fn=collate, drop_last=True)
    for ids in (trained, _ids(goodput)):
        assert len(ids) > corpus - HELDOUT - 64  # an epoch of the training data: all but the last batches
        assert not set(ids) & set(held)


def test_the_held_out_loss_is_the_final_model_s_loss_on_the_corpus_s_last_samples(tmp_path) -> None:
    _, heldout = write_split(str(tmp_path), limit=LIMIT)
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    assert heldout_loss(run_dir, heldout) is None  # a run that left no final model
    torch.manual_seed(1)
    model = TinyLM(ModelConfig(dropout=0.1))
    save_final_model(run_dir, model)
    windows = torch.from_numpy(samples(corpus_bytes(LIMIT), SAMPLE_BYTES)[-HELDOUT:].astype("int64"))
    model.eval()
    with torch.no_grad():
        logits = model(windows[:, :-1])
        expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), windows[:, 1:].reshape(-1))
    assert heldout_loss(run_dir, heldout) == pytest.approx(float(expected), abs=2e-4)
    assert (
        heldout_loss(run_dir, str(tmp_path / "missing")) is None
    )  # a --reference folder from before the split


def test_where_torchtitan_cannot_be_installed_the_contender_is_skipped_with_one_line(
    tmp_path, monkeypatch, capsys
) -> None:
    from goodput.bench._peers_table import print_table
    from goodput.bench._peers_titan_launch import titan_site

    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no package index: as on a machine offline
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(RuntimeError) as err:
        titan_site(str(tmp_path / "torchtitan"))
    reason = str(err.value)
    assert reason.startswith("torchtitan 0.3.0 could not be installed: pip install exited 1: ")
    assert (
        "\n" not in reason and os.listdir(tmp_path) == []
    )  # nothing half-installed left to be taken for done
    result = {
        "steps": 20,
        "baseline_every": 1,
        "skipped": {"titan": reason},
        "rows": [],
        "ratios": {},
        "goals": {},
    }
    print_table(result)
    assert f"titan: skipped: {reason}" in capsys.readouterr().out.splitlines()


def _kill_rank0_after(run_dir: str, steps: int, proc: subprocess.Popen) -> int:
    """SIGKILL the process holding rank 0 once it has logged ``steps`` steps; its pid."""
    log = os.path.join(run_dir, "samples", "rank-0.jsonl")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        pid = _holder(run_dir, 0)
        if pid is not None and os.path.exists(log) and Path(log).read_text().count("\n") >= steps:
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(0.05)  # polling for the condition above, not a timing assumption
    raise AssertionError(f"rank 0 did not reach step {steps}: see {run_dir}/launch.log")


@pytest.mark.slow
def test_the_titan_contender_resumes_from_torchtitan_s_checkpoint_exactly(tmp_path) -> None:
    from goodput.bench._peers_titan_launch import titan_site
    from goodput.bench.peers import _command, launch_env

    try:
        path = titan_site()
    except RuntimeError as err:
        pytest.skip(str(err))
    data, heldout = write_split(str(tmp_path))
    run_dir = str(tmp_path / "titan")
    os.makedirs(run_dir)
    steps = 60  # torchtitan saves every 3 steps (N / 20)
    env = launch_env(run_dir, os.pathsep.join([path, *sys.path]))  # the bench's own: store sharing off
    with open(os.path.join(run_dir, "launch.log"), "w") as out:
        proc = subprocess.Popen(
            _command("titan", data, run_dir, steps, None), stdout=out, stderr=out, env=env
        )
        try:
            _kill_rank0_after(run_dir, 20, proc)
            assert proc.wait(timeout=240) == 0, f"see {run_dir}/launch.log"
        finally:
            if proc.poll() is None:  # torchrun's ranks lead sessions of their own: kill them with it
                for pid in [*descendants(proc.pid), proc.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            proc.wait()
    restored = [e["step"] for e in read_events(run_dir, rank=0) if e["event"] == "restore_end"]
    # rank 0 was killed once it had logged 20 steps: the save of step 15 had ended by then (torchtitan starts an
    # async save only once the one before it has ended, and it started the save of 18), that of 18 may still have
    # been in flight (a loaded machine), so the newest complete save is 15 or 18 or later, always a save's step
    assert restored[0] is None and restored[1] is not None and 15 <= restored[1] < 60, restored
    assert restored[1] % 3 == 0, restored
    saved = os.listdir(os.path.join(run_dir, "checkpoints"))  # torchtitan's own step-N folders, the last kept
    assert f"step-{steps}" in saved and all(name.startswith("step-") for name in saved)
    # the fault-free order, from the sampler itself: each rank's 16 samples a step, in order
    dataset = ShardedDataset(data, decode=decode)
    reference = {}
    for rank in (0, 1):
        order = list(
            torch.utils.data.distributed.DistributedSampler(
                dataset, num_replicas=2, rank=rank, shuffle=False, drop_last=True
            )
        )
        reference[rank] = [{"step": s, "samples": order[16 * (s - 1) : 16 * s]} for s in range(1, steps + 1)]
    counts = exactness(read_records(run_dir), reference, steps)
    assert counts["steps_missing"] == 0 and counts["steps_redone"] >= 1
    assert (
        counts["samples_twice"] == counts["samples_never"] == 0
    )  # the data position came back with the model
    loss = heldout_loss(run_dir, heldout)
    assert loss is not None and 0 < loss < 6  # ln(256) = 5.5 is a model that learned nothing
