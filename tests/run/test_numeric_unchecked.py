"""A NaN gradient on a step whose gradients the numeric guard does not check (``grads_every``) in a parameter that
no loss reads: the replica check's sum of the parameters finds it, and the rollback passes over every checkpoint
holding it, in one process."""

from __future__ import annotations

import math
from pathlib import Path

import torch

import goodput as gp
from goodput.ledger.ledger import read_events
from tests.helpers.numeric import train_in_process


def _train(run_dir: str, faults: str) -> list[float]:
    """Token 0's embedding row is never read (the tokens are 1-7): a NaN in it leaves every loss finite. Returns
    the final parameters, flattened."""
    numeric = gp.NumericConfig(grads_every=4, check_every=4, spike_k=None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Flatten(), torch.nn.Linear(12, 1))
    train_in_process(run_dir, model, torch.randint(1, 8, (64, 3)), steps=16, numeric=numeric, faults=faults)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def test_a_nan_in_a_parameter_no_loss_reads_is_found_by_the_replica_check_and_never_trained_on(
    tmp_path: Path,
) -> None:
    faulty = _train(str(tmp_path / "run"), "nan@step=6,into=grad")  # the guard checks steps 4, 8, ...
    events = read_events(str(tmp_path / "run"), rank=0)
    found = [(e["kind"], e["step"], e["detail"]) for e in events if e["event"] == "numeric_fault"]
    assert found == [("nonfinite", 8, "the parameters")]  # no loss saw it: the check at step 8 did
    assert [e["step"] for e in events if e["event"] == "rollback_nonfinite"] == [7]
    assert [(e["from_step"], e["to_step"]) for e in events if e["event"] == "rollback"] == [(8, 4)]
    assert all(math.isfinite(x) for x in faulty)
    assert faulty == _train(str(tmp_path / "clean"), "")  # as if the NaN had never been
