"""The planner: pure models of failures, checkpoint waste and goodput, and a Monte Carlo check of them.

``model`` holds the closed forms (failure probability, waste per failure, first-order and Daly's exact
goodput, the Young/Daly/exact optimum); ``shrink`` the goodput and capacity goodput of a job that answers
failures by shrinking in place and growing back; ``simulation`` replays a job's failures and checkpoints to check
them. Nothing here does I/O, reads a clock or touches torch: inputs in, numbers out.
"""

from goodput.planning.model import (
    Costs,
    PlanInputs,
    daily_waste,
    daly_interval,
    goodput_daly,
    goodput_first_order,
    lost_work_per_failure,
    mtbf_seconds,
    optimal_interval,
    waste_per_failure,
    young_interval,
)
from goodput.planning.shrink import goodput_shrink
from goodput.planning.twolevel import durable_share, goodput_covered

__all__ = [
    "Costs",
    "PlanInputs",
    "daily_waste",
    "daly_interval",
    "durable_share",
    "goodput_covered",
    "goodput_daly",
    "goodput_first_order",
    "goodput_shrink",
    "lost_work_per_failure",
    "mtbf_seconds",
    "optimal_interval",
    "waste_per_failure",
    "young_interval",
]
