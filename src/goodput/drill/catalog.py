"""Every module of drill scenarios, in the order the table shows them: importing one registers its scenarios.

Add a module of scenarios with one line in its block below (each module calls
:func:`goodput.drill.scenario.register` for each of its scenarios at import).
"""

from __future__ import annotations

__all__ = ["MODULES"]

MODULES = (
    # process scenarios: rank, hang, preempt, agent, launcher
    "goodput.drill.process",
    "goodput.drill.supervisors",
    # storage and node scenarios: storage-full, storage-slow, throttled, flaky, node, node-store
    "goodput.drill.node",
    # numeric and straggler scenarios: nan, spike, bitflip, slow
    "goodput.drill.numeric",
)
