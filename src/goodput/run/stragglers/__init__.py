"""The straggler detector: each rank's own time per step against its wait for the others, scored once a window,
with an alarm that stops the job or hands the slow rank to a hot spare (docs/stragglers.md).

``monitor`` is the worker side and the run's hook, ``rules`` the pure scores and alarms, ``waits`` the clocks on
DDP's and FSDP2's collectives.
"""

from goodput.run.stragglers.monitor import (
    StragglerHook,
    StragglerMonitor,
    StragglerReplaced,
    attach_stragglers,
)
from goodput.run.stragglers.rules import StragglerConfig

__all__ = ["StragglerConfig", "StragglerHook", "StragglerMonitor", "StragglerReplaced", "attach_stragglers"]
