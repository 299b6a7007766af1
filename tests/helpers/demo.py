"""One uninterrupted run of the demo training (goodput.demo.verify_train) that the chaos tests compare against.

The save interval changes no bit of training (that is what the chaos tests check), so runs that save every 4 or
every 8 steps, with or without the memory tier, are all compared with this one run: the suite trains it once
(the session fixture ``demo_reference`` in tests/conftest.py) instead of once per test file.
"""

from __future__ import annotations

import os

from goodput.demo.verify_train import prepare_data, train

# What every run compared with the reference must share: world size, steps, checkpoint strategy and seed.
NPROC, STEPS, STRATEGY, SEED = 2, 40, "dcp_async", 0


def reference(work: str) -> tuple[str, str]:
    """The demo's data and its uninterrupted run (a save every 4 steps), both under ``work``."""
    data = prepare_data(work)
    run_dir = os.path.join(work, "uninterrupted")
    status = train(
        run_dir, data=data, faults="", nproc=NPROC, steps=STEPS, every=4, strategy=STRATEGY, seed=SEED,
        max_restarts=0,
    )  # fmt: skip
    assert status == 0, "the uninterrupted demo run failed"
    return data, run_dir
