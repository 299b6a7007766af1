"""The planner: pure models of failures, checkpoint waste and goodput, and a Monte Carlo check of them.

``model`` holds the closed forms (failure probability, waste per failure, first-order and Daly's exact
goodput, the Young/Daly/exact optimum); ``shrink`` the goodput and capacity goodput of a job that answers
failures by shrinking in place and growing back; ``simulation`` replays a job's failures and checkpoints to check
them. Nothing here does I/O, reads a clock or touches torch: inputs in, numbers out.
"""

from goodput.planning.model import (
    PlanInputs,
    daily_waste,
    daly_expected_time,
    daly_interval,
    failure_probability,
    goodput_daly,
    goodput_first_order,
    lost_work_per_failure,
    mtbf_from_rate,
    mtbf_seconds,
    optimal_interval,
    waste_per_failure,
    young_interval,
)
from goodput.planning.shrink import ShrinkGoodput, goodput_shrink
from goodput.planning.simulation import SimulationResult, simulate_goodput
from goodput.planning.twolevel import (
    TwoLevelPlan,
    durable_share,
    goodput_covered,
    goodput_two_level,
    plan_two_level,
    simulate_two_level,
)

__all__ = [
    "PlanInputs",
    "ShrinkGoodput",
    "SimulationResult",
    "TwoLevelPlan",
    "daily_waste",
    "daly_expected_time",
    "daly_interval",
    "durable_share",
    "failure_probability",
    "goodput_covered",
    "goodput_daly",
    "goodput_first_order",
    "goodput_shrink",
    "goodput_two_level",
    "lost_work_per_failure",
    "mtbf_from_rate",
    "mtbf_seconds",
    "optimal_interval",
    "plan_two_level",
    "simulate_goodput",
    "simulate_two_level",
    "waste_per_failure",
    "young_interval",
]
