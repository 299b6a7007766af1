"""The picture behind ``goodput report --plot``: attempts coloured by category, and goodput over time; for a
run that trained on fewer ranks than it reserved (a shrink, or started short), the world size on a second axis."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from goodput.ledger.accounting import CATEGORIES, Accounting, Segment, goodput_over_time

if TYPE_CHECKING:
    from goodput.ledger.report import Report

COLOURS = {
    "productive": "#2ca02c",
    "data_wait": "#ff7f0e",
    "checkpoint_stall": "#d62728",
    "checkpoint_restore": "#9467bd",
    "rollback": "#8c564b",
    "init": "#1f77b4",
    "warmup": "#bcbd22",
    "straggler_wait": "#17becf",
    "lost_work": "#7f0000",
    "restart_downtime": "#555555",
    "reshape": "#ffbb78",
    "failure_detection": "#e377c2",
    "other": "#c7c7c7",
    "between_launches": "#f0f0f0",
}
WORLD_COLOUR = "#6a3d9a"  # the world size line (second axis of the goodput panel)
# Above this many segments the timeline is drawn in bins, each a stack of its categories' shares: a step's
# thin data_wait sliver would otherwise vanish (or flicker) at screen resolution.
MAX_SEGMENTS = 600
BINS = 600


_BEGUN = {"restart": "restart", "relaunch": "relaunch", "rollback": "rollback", "shrink": "shrink",
          "grow": "grow"}  # fmt: skip
_ENDED = {"rollback": "rolled back", "shrink": "a rank failed, shrank"}  # by what began the next attempt


def _ended(acc: Accounting, i: int) -> str:
    """How attempt ``i`` ended, as the next attempt's beginning tells: a rollback in place is no failure."""
    following = acc.attempts[i + 1].began if i + 1 < len(acc.attempts) else None
    return _ENDED.get(following or "", acc.attempts[i].outcome)


def _unit(wall: float) -> tuple[float, str]:
    if wall < 300:
        return 1.0, "s"
    if wall < 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def _bins(segments: tuple[Segment, ...], start: float, wall: float) -> dict[int, list[dict[str, float]]]:
    """Per attempt, per bin: seconds of each category inside the bin."""
    width = wall / BINS
    out: dict[int, list[dict[str, float]]] = {}
    for seg in segments:
        row = out.setdefault(seg.attempt, [{} for _ in range(BINS)])
        first = max(0, int((seg.start - start) / width))
        last = min(BINS - 1, int((seg.end - start) / width))
        for b in range(first, last + 1):
            lo, hi = max(seg.start, start + b * width), min(seg.end, start + (b + 1) * width)
            if hi > lo:
                row[b][seg.category] = row[b].get(seg.category, 0.0) + hi - lo
    return out


def _draw_binned(ax: Any, acc: Any, rows: dict[int, int], scale: float) -> None:
    width = acc.wall_seconds / BINS
    for number, bins in _bins(acc.segments, 0.0, acc.wall_seconds).items():
        base = [0.0] * BINS
        totals = [sum(b.values()) for b in bins]
        for category in CATEGORIES:
            xs, heights, bottoms = [], [], []
            for i, b in enumerate(bins):
                if b.get(category, 0.0) > 0:
                    share = b[category] / totals[i]
                    xs.append(i * width / scale)
                    heights.append(0.76 * share)
                    bottoms.append(rows[number] - 0.38 + 0.76 * base[i])
                    base[i] += share
            if xs:
                ax.bar(
                    xs,
                    heights,
                    width=width / scale,
                    bottom=bottoms,
                    align="edge",
                    color=COLOURS[category],
                    lw=0,
                )


def _draw_segments(ax: Any, acc: Any, rows: dict[int, int], scale: float) -> None:
    for category in CATEGORIES:
        for number, row in rows.items():
            bars = [
                (s.start / scale, (s.end - s.start) / scale)
                for s in acc.segments
                if s.category == category and s.attempt == number
            ]
            if bars:
                ax.broken_barh(bars, (row - 0.38, 0.76), facecolors=COLOURS[category], linewidth=0)


def plot_report(report: Report, path: str, *, window: float | None = None) -> None:
    """Write the timeline (one row per attempt) and rolling/cumulative goodput to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = report_figure(report, window=window)
    fig.savefig(path)
    plt.close(fig)


def report_figure(report: Report, *, window: float | None = None) -> Any:
    """The figure :func:`plot_report` writes (a matplotlib ``Figure``; the caller closes it)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    acc = report.accounting
    wall = max(acc.wall_seconds, 1e-9)
    scale, unit = _unit(wall)
    numbers = [a.number for a in acc.attempts]
    rows = {n: i for i, n in enumerate(numbers)}
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(11, 3.2 + 0.45 * len(numbers)),
        dpi=120,
        sharex=True,
        gridspec_kw={"height_ratios": [max(1.2, 0.45 * len(numbers)), 2.2]},
    )
    if len(acc.segments) > MAX_SEGMENTS:
        _draw_binned(top, acc, rows, scale)
    else:
        _draw_segments(top, acc, rows, scale)
    top.set_yticks(range(len(numbers)))
    top.set_yticklabels([f"attempt {a.number} ({_ended(acc, i)})" for i, a in enumerate(acc.attempts)])
    top.set_ylim(len(numbers) - 0.5, -0.5)
    capacity = f", capacity goodput {acc.capacity_goodput:.1%}" if acc.capacity_goodput < acc.goodput else ""
    top.set_title(
        f"{report.run_dir or 'run'}: goodput {acc.goodput:.1%}{capacity} of {wall / scale:.3g} {unit}"
    )
    legend = [
        Patch(color=COLOURS[c], label=f"{c} {acc.categories[c] / wall:.1%}")
        for c in CATEGORIES
        if acc.categories[c] > 0
    ]
    top.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    handles = _goodput_panel(bottom, report, window or wall / 20.0, scale, unit) + _world_axis(
        bottom, acc, scale
    )
    # beyond the ranks axis' ticks and label when there is one
    right = 1.01 if len(bottom.figure.axes) == 2 else 1.09
    bottom.legend(handles=handles, loc="upper left", bbox_to_anchor=(right, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def _goodput_panel(ax: Any, report: Report, window: float, scale: float, unit: str) -> list[Any]:
    """Rolling and cumulative goodput, the prediction, and a line at each attempt begun after the first, named
    for what began it; returns the lines for the legend."""
    acc = report.accounting
    rolling = goodput_over_time(acc, window=window, points=400)
    cumulative = goodput_over_time(acc, window=acc.wall_seconds + 1.0, points=400)
    ax.plot(
        [t / scale for t, _ in rolling],
        [100 * g for _, g in rolling],
        color="#2ca02c",
        lw=1.6,
        label=f"goodput, trailing {window / scale:.3g} {unit}",
    )
    ax.plot(
        [t / scale for t, _ in cumulative],
        [100 * g for _, g in cumulative],
        color="black",
        lw=1.2,
        ls="--",
        label="goodput since start",
    )
    predicted = report.prediction.predicted_goodput
    if predicted is not None:
        ax.axhline(100 * predicted, color="#1f77b4", lw=1, ls=":", label=f"predicted {predicted:.1%}")
    for attempt in acc.attempts[1:]:
        ax.axvline(attempt.start / scale, color="#555555", lw=0.8, alpha=0.6)
    ax.set_ylim(0, 105)
    ax.set_ylabel("goodput (%)")
    begun = Counter(a.began for a in acc.attempts[1:])
    lines = ", ".join(f"{n} {_BEGUN[what]}{'s' if n > 1 else ''}" for what, n in sorted(begun.items()))
    ax.set_xlabel(f"time since the run started ({unit})" + (f"; grey lines: {lines}" if lines else ""))
    ax.grid(alpha=0.3)
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]  # not the grey lines


def _world_axis(ax: Any, acc: Accounting, scale: float) -> list[Any]:
    """The world size in force (a step line) against the reserved ranks (dashed), on a second y axis, when
    the run ever trained short of its reservation; returns its lines for the legend."""
    if not any(w.world < w.reserved for w in acc.world):
        return []
    from matplotlib.ticker import MaxNLocator

    twin = ax.twinx()
    spans = [*acc.world, acc.world[-1]]  # each span from its start, the last one held to its end
    xs = [w.start / scale for w in acc.world] + [acc.world[-1].end / scale]
    twin.plot(
        xs, [w.world for w in spans], color=WORLD_COLOUR, lw=1.6, drawstyle="steps-post", label="world size"
    )
    twin.plot(xs, [w.reserved for w in spans], color=WORLD_COLOUR, lw=1, ls="--", drawstyle="steps-post",
              label="reserved ranks")  # fmt: skip
    top = max(w.reserved for w in acc.world)
    twin.set_ylim(0, top * 1.05)
    twin.yaxis.set_major_locator(MaxNLocator(integer=True))  # ranks are whole
    twin.set_ylabel("ranks", color=WORLD_COLOUR)
    return list(twin.get_lines())
