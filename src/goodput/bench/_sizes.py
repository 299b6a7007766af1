"""Several state sizes in one benchmark run: the sizes flag, and the table of each ratio against its value at
the smallest size (``goodput bench checkpoint`` and ``goodput bench recovery``).

A cost over its floor that grows with the state means a cost that grows faster than the bytes (superlinear):
each must stay below ``GROWTH`` times its value at the smallest size (a floor over its cost, such as
``dcp_write_over_raw_write``, must stay above ``1 / GROWTH`` times it); falling is fixed costs amortised, and
allowed. Staging memory must stay within ``STAGING`` of the state at every size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from goodput.errors import ConfigError
from goodput.units import parse_bytes

__all__ = ["GROWTH", "STAGING", "parse_sizes", "print_results", "print_scale", "scale_table"]

GROWTH = 1.3
STAGING = 1.1


def parse_sizes(text: str, *, what: str = "--state-size") -> list[int]:
    """Bytes of each size in a comma list (``256MiB,1GiB,2GiB``), smallest first, each at least 1 MiB."""
    sizes = sorted({parse_bytes(part.strip(), what=what) for part in text.split(",") if part.strip()})
    if not sizes or sizes[0] < (1 << 20):
        raise ConfigError(f"{what} takes sizes of at least 1MiB, comma-separated, got {text!r}")
    return sizes


def scale_table(
    results: Sequence[dict[str, Any]], keys: Mapping[str, bool], staging_key: str
) -> dict[str, Any]:
    """Per ratio: its value at each size, over its value at the smallest size, and whether that stays within
    ``GROWTH``; and the staging memory over the state at each size, within ``STAGING``.

    Args:
        results: one benchmark result per size (smallest first), each with a ``ratios`` dict.
        keys: the ratios to a floor to follow, each True when it is a cost over its floor, False when it is
            a floor over its cost (those missing or None at any size are left out).
        staging_key: the ratio of staging memory to the state.
    """
    rows: dict[str, Any] = {}
    for key, cost_over_floor in keys.items():
        values = [r["ratios"].get(key) for r in results]
        if any(v is None for v in values) or not values[0]:
            continue
        growth = [v / values[0] for v in values]
        rows[key] = {
            "values": values,
            "over_smallest": growth,
            "within": all(g <= GROWTH if cost_over_floor else g >= 1 / GROWTH for g in growth),
        }
    staging = [r["ratios"].get(staging_key) for r in results]
    return {
        "ratios": rows,
        "staging": {
            "key": staging_key,
            "values": staging,
            "within": all(v is not None and v <= STAGING for v in staging),
        },
    }


def print_scale(sizes: Sequence[int], table: dict[str, Any]) -> None:
    """One table: a row per ratio, a column per size (value, and over the smallest size's)."""
    head = "".join(f"{size / 2**20:>16.0f}MiB" for size in sizes)
    print(f"{'ratio (x over the smallest size)':<40}{head}  superlinear? (limit {GROWTH}x)")
    for key, row in table["ratios"].items():
        cells = "".join(
            f"{v:>11.2f} ({g:.2f}x)" for v, g in zip(row["values"], row["over_smallest"], strict=True)
        )
        print(f"{key:<40}{cells}  {'no' if row['within'] else 'YES'}")
    staging = table["staging"]
    cells = "".join("n/a".rjust(19) if v is None else f"{v:>19.2f}" for v in staging["values"])
    print(f"{staging['key']:<40}{cells}  <= {STAGING}: {'yes' if staging['within'] else 'NO'}")


def print_results(
    sizes: Sequence[int], results: list[dict[str, Any]], floor_ratios: Mapping[str, bool], *, as_json: bool
) -> None:
    """What a benchmark over ``sizes`` prints once every size ran: with JSON, its one result or every result
    and the scale table; as text (each result was printed as it came), the scale table of several sizes."""
    if len(sizes) == 1:
        if as_json:
            print(json.dumps(results[0], indent=1))
        return
    table = scale_table(results, floor_ratios, "staging_memory_over_state_bytes")
    if as_json:
        print(json.dumps({"sizes": sizes, "results": results, "scale": table}, indent=1))
    else:
        print_scale(sizes, table)
