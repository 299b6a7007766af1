"""``goodput bench SCENARIO``: benchmark commands (never timed tests). Each prints ratios measured in one run."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["register"]

# Each name is a module goodput.bench.<name> with add_arguments(parser) and run(args) -> int.
_SCENARIOS: tuple[str, ...] = (
    "checkpoint",
    "control",
    "data",
    "cache",
    "ledger",
    "numeric",
    "peers",
    "recovery",
    "restart",
    "spares",
    "stragglers",
)


def register(sub: Any) -> None:
    parser = sub.add_parser("bench", help="run a benchmark scenario and print measured ratios")
    scenarios = parser.add_subparsers(dest="scenario", metavar="SCENARIO", parser_class=type(parser))
    scenarios.required = True
    for name in _SCENARIOS:
        module = importlib.import_module(f"goodput.bench.{name}")
        doc = (module.__doc__ or "").strip().splitlines()
        scenario = scenarios.add_parser(name, help=doc[0] if doc else name, description=module.__doc__)
        module.add_arguments(scenario)
        scenario.set_defaults(handler=module.run)
