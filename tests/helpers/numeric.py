"""The numeric guard's spike verdict replayed over a recorded loss curve, as one rank alone would draw it."""

from __future__ import annotations

import json
import os

import torch

import goodput as gp
from goodput.run.numeric import NumericConfig
from goodput.run.numeric.rules import FLAG_LOSS, encode_row, verdict
from tests.helpers.paths import FIXTURES


def recorded_losses(name: str, steps: int | None = None) -> list[float]:
    """The loss curve recorded in ``tests/fixtures/numeric/NAME``, checked to hold ``steps`` steps if given."""
    with open(FIXTURES / "numeric" / name) as f:
        losses = [float(x) for x in json.load(f)["losses"]]
    assert steps is None or len(losses) == steps
    return losses


def replay_alarms(losses: list[float], start: int, config: NumericConfig) -> list[int]:
    """The steps the guard's verdict calls a spike when its window starts at ``start`` (a relaunch there)."""
    history: list[float] = []
    alarms = []
    for step in range(start, len(losses)):
        found = verdict(
            [encode_row(FLAG_LOSS, losses[step], 0, 0.0)], history=history[-config.spike_window :],
            warmup=config.spike_warmup, k=config.spike_k or 0.0, min_rise=config.spike_min_rise, spikes=True,
            comparable=False,
        )  # fmt: skip
        if found.kind == "spike":
            alarms.append(step)  # rolled back and redone: the window does not take it
        else:
            history.append(losses[step])
    return alarms


def train_in_process(
    run_dir: str,
    model: torch.nn.Module,
    data: torch.Tensor,
    *,
    steps: int,
    numeric: NumericConfig,
    faults: str,
) -> list[int]:
    """``model`` trained on ``data`` by one process (batches of 2, loss = mean square + 1), DCP every 4 steps and
    the memory tier every step, for ``steps`` steps; the steps it finished, in order (redos included)."""
    config = gp.CheckpointConfig(
        root=os.path.join(run_dir, "checkpoints"),
        strategy="dcp",
        every=4,
        memory=gp.MemoryTier(every=1, keep=2, folder=os.path.join(run_dir, "ram")),
    )
    run = gp.Run(
        run_dir, total_steps=steps, checkpoint=config, numeric=numeric, faults=faults, hang_timeout=None,
        progress=False,
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = gp.ResumableLoader(torch.utils.data.TensorDataset(data), batch_size=2, seed=0, drop_last=True)
    run.restore(model=model, optimizer=opt, loader=loader)
    finished = []
    try:
        for (batch,) in run.batches(loader):
            loss = model(batch).pow(2).mean() + 1.0
            loss.backward()
            opt.step()
            opt.zero_grad()
            finished.append(run.step + 1)
            run.step_done(loss=loss.item())
    finally:
        run.close()
    return finished
