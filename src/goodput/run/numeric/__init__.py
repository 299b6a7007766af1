"""The numeric guard: find NaN/Inf, loss spikes and corrupted replicas, roll back in place, skip the bad data
(``guard``; docs/numeric-faults.md), and without it the stop at a non-finite loss (``loss_stop``).

``config`` holds its settings, ``rules`` the pure verdicts and the word each rank sends, ``spikes`` the spike rule's window, ``ops`` the
operations on tensors, groups and files, ``grads`` the check of DDP's gradient buckets, ``carry`` the word riding
the next step's first bucket and ``exchange`` the all-gather on the guard's own group without DDP.

The names are imported on first use: the command line and the drill read the skip list's constants through
``ops`` without importing the guard (and torch with it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from goodput._lazy import lazy_names

if TYPE_CHECKING:
    from goodput.run.numeric.config import NumericConfig
    from goodput.run.numeric.guard import NumericGuard
    from goodput.run.numeric.loss_stop import LossStop
    from goodput.run.numeric.ops import NO_REPLICAS, SKIPS_FILE, read_skips

__all__ = ["NO_REPLICAS", "SKIPS_FILE", "LossStop", "NumericConfig", "NumericGuard", "read_skips"]

_MODULES = {
    "NO_REPLICAS": "goodput.run.numeric.ops",
    "SKIPS_FILE": "goodput.run.numeric.ops",
    "LossStop": "goodput.run.numeric.loss_stop",
    "NumericConfig": "goodput.run.numeric.config",
    "NumericGuard": "goodput.run.numeric.guard",
    "read_skips": "goodput.run.numeric.ops",
}

__getattr__, __dir__ = lazy_names(__name__, _MODULES, globals(), __all__)
