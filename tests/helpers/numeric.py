"""The numeric guard's spike verdict replayed over a recorded loss curve, as one rank alone would draw it."""

from __future__ import annotations

import json

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
