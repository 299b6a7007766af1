"""The picture behind ``goodput plan --plot``: goodput against the checkpoint interval (matplotlib, Agg)."""

from __future__ import annotations

from typing import Any

from goodput.planning import PlanInputs, goodput_daly, goodput_first_order

HOUR = 3600.0
_TICKS = [s * 60.0 for s in (1, 2, 5, 10, 15, 30)] + [
    h * HOUR for h in (1, 2, 4, 8, 12, 24, 48, 96, 192, 384)
]


def short_duration(seconds: float) -> str:
    """A compact reading of a duration for tables and axes: ``20s``, ``15m``, ``60m``, ``3.08h``, ``35.6d``."""
    if seconds < 120:
        return f"{seconds:.3g}s"
    if seconds < 1.5 * HOUR:
        return f"{seconds / 60:.3g}m"
    if seconds < 2 * 86400:
        return f"{seconds / HOUR:.3g}h"
    return f"{seconds / 86400:.3g}d"


def _span(plan: dict[str, Any], intervals: list[float]) -> tuple[float, float]:
    """The x range: every marked interval with room on both sides."""
    marks = [*intervals, plan["recommended"]["interval_hours"] * HOUR]
    marks = [mark for mark in marks if mark > 0]
    return min(marks) / 2.5, max(marks) * 3.0


def _mark(ax: Any, plan: dict[str, Any]) -> None:
    """The optimum (green) and the user's intervals (orange, labelled)."""
    best_h, best_g = plan["recommended"]["interval_hours"], plan["recommended"]["goodput"] * 100
    if best_h > 0:
        ax.axvline(best_h, color="tab:green", lw=1, ls=":")
        label = f"optimum {short_duration(best_h * HOUR)}: {best_g:.2f}%"
        ax.plot([best_h], [best_g], "o", color="tab:green", ms=9, zorder=5, label=label)
    for row in plan["rows"]:
        g = row["goodput"] * 100
        ax.plot([row["interval_hours"]], [g], "s", color="tab:orange", ms=7, zorder=4)
        ax.annotate(
            f"{short_duration(row['interval_hours'] * HOUR)}\n{g:.2f}%",
            (row["interval_hours"], g),
            textcoords="offset points",
            xytext=(0, -32),
            ha="center",
            fontsize=9,
            color="tab:orange",
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85},
            zorder=6,
        )
    ax.plot([], [], "s", color="tab:orange", label="your intervals")
    if best_h <= 0:
        ax.plot([], [], " ", label="no checkpoint stall: shorter intervals always win")


def _axes(ax: Any, plan: dict[str, Any], inputs: PlanInputs, hours: Any, exact: Any) -> None:
    """Limits, log-scale duration ticks, labels and the title."""
    import matplotlib.ticker as mticker

    top = float(exact.max())
    bottom = float(min(exact.min(), *(row["goodput"] * 100 for row in plan["rows"])))
    pad = max((top - bottom) * 0.12, 0.05)
    ax.set_ylim(bottom - 2.5 * pad, min(100.0, top + pad))
    ax.set_xscale("log")
    ax.set_xlim(hours[0], hours[-1])
    ax.xaxis.set_major_locator(
        mticker.FixedLocator([t / HOUR for t in _TICKS if hours[0] <= t / HOUR <= hours[-1]])
    )
    ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda x, _: short_duration(x * HOUR)))
    ax.xaxis.set_minor_formatter(mticker.NullFormatter())
    ax.set_xlabel("checkpoint interval (compute time between checkpoints, log scale)", fontsize=11)
    ax.set_ylabel("goodput (% of wall time spent on useful training)", fontsize=11)
    if inputs.gpus is not None and inputs.afr is not None:
        job = f"{inputs.gpus} GPUs, AFR {100 * inputs.afr:g}%/yr"
    else:
        job = f"{plan['inputs']['failures_per_day']:g} failures/day"
    ax.set_title(
        f"Goodput vs checkpoint interval — {job}, MTBF {short_duration(inputs.mtbf)}\n"
        f"stall {short_duration(inputs.ckpt_stall)}, persist {short_duration(inputs.persist)}, "
        f"restart {short_duration(inputs.restart)}, detect {short_duration(inputs.detect)}",
        fontsize=12,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", fontsize=10, framealpha=0.9)


def plot_plan(plan: dict[str, Any], inputs: PlanInputs, intervals: list[float], path: str) -> None:
    """Draw goodput (Daly exact and first order) against the interval, the optimum and the user's intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    costs = inputs.costs()
    low, high = _span(plan, intervals)
    taus = np.geomspace(max(low, inputs.persist, 1e-3), high, 400)
    exact = np.array([goodput_daly(t, costs) for t in taus]) * 100
    first = np.array([goodput_first_order(t, costs) for t in taus]) * 100
    hours = taus / HOUR

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    ax.plot(hours, exact, color="tab:blue", lw=2.2, label="goodput (Daly 2006, exact model)")
    ax.plot(hours, first, color="tab:gray", lw=1.2, ls="--", label="first-order estimate")
    _mark(ax, plan)
    _axes(ax, plan, inputs, hours, exact)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
