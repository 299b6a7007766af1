"""``goodput demo``: the main job, end to end.

A byte-level transformer LM trains on Python's own standard-library source, written as shards to a "remote"
folder (or any fsspec URL such as s3://) and read through the local cache; 2 ranks under torchrun (gloo on
CPU, NCCL on GPUs); async checkpoints at the planner's interval; SIGKILLs at random with a set mean time
between failures; automatic restarts by torchrun. At the end: the goodput report, the timeline plot and the
loss curve.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any

from goodput.errors import ConfigError, check_at_least

__all__ = ["DemoConfig", "run_demo"]

TRAIN_SCRIPT = os.path.join(os.path.dirname(__file__), "train.py")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """The demo's knobs (``goodput demo --help``)."""

    run_dir: str
    nproc: int = 2
    steps: int = 2000
    mtbf: float = 40.0
    strategy: str = "dcp_async"
    every: str = "auto"
    data_url: str | None = None
    max_restarts: int = 30
    seed: int = 0
    faults: bool = True
    batch_size: int = 16
    slow_rank: int | None = None
    restart: str = "warm"  # more goodput than cold restarts (docs/BENCHMARKS.md has the figures)
    # Two spares: at one failure every 40 s, two failures within a spare's start (its imports take seconds)
    # are common enough that a lone spare is often still importing when the second one comes. 0: no spare, the
    # survivors shrink in place and the job grows back when a replacement is ready.
    spares: int = 2

    def __post_init__(self) -> None:
        check_at_least("--nproc", self.nproc, 1)
        check_at_least("--steps", self.steps, 10)
        if self.mtbf <= 0:
            raise ConfigError(f"--mtbf must be > 0, got {self.mtbf}")
        check_at_least("--max-restarts", self.max_restarts, 0)
        if self.slow_rank is not None and not 0 <= self.slow_rank < self.nproc:
            raise ConfigError(f"--slow-rank must be a rank in 0..{self.nproc - 1}, got {self.slow_rank}")
        if self.restart not in ("cold", "warm"):
            raise ConfigError(f"--restart must be cold or warm, got {self.restart!r}")
        check_at_least("--spares", self.spares, 0)
        if self.spares != 2 and self.restart != "warm":
            raise ConfigError("--spares counts hot spares of warm restarts: give it with --restart warm")


def run_demo(config: DemoConfig) -> int:
    """Prepare the data, train under torchrun with faults, and report; returns the exit status."""
    from goodput.launch.launcher import LaunchConfig, launch_job

    os.makedirs(config.run_dir, exist_ok=True)
    data = config.data_url or os.path.join(config.run_dir, "remote-data")
    started = time.monotonic()
    if _needs_data(data):
        from goodput.demo.prepare import write_corpus  # imports torch (goodput.data): only when writing

        count = write_corpus(data)
        print(f"demo: wrote {count} samples of Python stdlib source as shards to {data}")
    faults = f"kill@mtbf={config.mtbf}s,seed={config.seed}; {numeric_faults(config)}" if config.faults else ""
    print(
        f"demo: {config.nproc} ranks, {config.steps} steps, {config.strategy} checkpoints every {config.every}, "
        + (
            f"SIGKILL at random every {config.mtbf:.0f}s on average, and {numeric_faults(config)}"
            if faults
            else "no injected faults"
        )
    )
    if config.slow_rank is not None:  # a straggler drill: that rank's process 1.5x slower, the detector on
        faults = "; ".join(f for f in (faults, f"slow@rank={config.slow_rank},factor=1.5,persist") if f)
        print(f"demo: rank {config.slow_rank}'s steps take 1.5x as long; the straggler detector is on")
    script = (
        TRAIN_SCRIPT,
        f"--data={data}",
        f"--steps={config.steps}",
        f"--strategy={config.strategy}",
        f"--every={config.every}",
        f"--mtbf={config.mtbf}",
        f"--seed={config.seed}",
        f"--batch-size={config.batch_size}",
        "--numeric",
        *(["--stragglers"] if config.slow_rank is not None else []),
        *(
            [f"--global-batch={shrink_global_batch(config.batch_size, config.nproc)}"]
            if _shrinks(config)
            else []
        ),
    )
    if _shrinks(config):
        batch = shrink_global_batch(config.batch_size, config.nproc)
        print(
            f"demo: no spare: the survivors of a failure train on in place, and the job grows back when a "
            f"replacement is ready; the global batch of {batch} is kept on any of 1..{config.nproc} ranks"
        )
    launch = LaunchConfig(
        script=script,
        nproc=config.nproc,
        max_restarts=config.max_restarts,
        run_dir=config.run_dir,
        faults=faults,
    )
    if config.restart == "warm":
        from goodput.warm.agent import WarmConfig, launch_warm

        shrink = 0.0 if _shrinks(config) else None  # no spare: shrink at once, grow back when one is ready
        status = launch_warm(launch, WarmConfig(spares=config.spares, shrink_after=shrink))
    else:
        status = launch_job(launch)
    print(f"demo: training finished with exit status {status} after {time.monotonic() - started:.0f}s")
    _summarise(config)
    return status


def _shrinks(config: DemoConfig) -> bool:
    """Whether the demo answers failures by shrinking in place (warm restarts with no spare)."""
    return config.restart == "warm" and config.spares == 0 and config.nproc > 1


def shrink_global_batch(batch_size: int, nproc: int, min_world: int = 1) -> int:
    """The demo's global batch when it shrinks in place: the smallest that is at least ``batch_size`` per rank
    on all ``nproc`` ranks and splits evenly over every world size from ``min_world`` to ``nproc`` (the rule
    ``--shrink-after`` enforces, so the global batch and the learning-rate schedule stay as configured while the
    per-rank batch grows). 2 ranks of 16: 32; 4 ranks of 16: 72 (a multiple of 3 and 4)."""
    import math

    if batch_size < 1 or not 1 <= min_world <= nproc:
        raise ConfigError(f"no global batch for {batch_size} per rank on {min_world}..{nproc} ranks")
    step = math.lcm(*range(min_world, nproc + 1))
    return -(-batch_size * nproc // step) * step


def numeric_faults(config: DemoConfig) -> str:
    """The demo's numeric faults (:func:`goodput.verify.rollback.drill_plan`): a NaN loss on the last rank at
    30% of the steps that comes back on the redo, as a NaN in the data does (rolled back, then rolled back again
    and its window skipped), a 20x loss spike at 55% (rolled back), a flipped bit in rank 0's parameters at the
    replica check at 80% (rolled back, and the rank named on the redo)."""
    from goodput.verify.rollback import drill_plan

    return drill_plan(config.steps, config.nproc)


def _needs_data(url: str) -> bool:
    """Whether the corpus must be written to ``url`` (no index there yet); the first touch of the store, so
    storage that refuses the credentials or cannot be reached is one line (exit 2) before anything starts."""
    import fsspec

    from goodput._storage_errors import describe, redact_url, refusals_named
    from goodput.errors import AccessRefused

    try:
        with refusals_named(url, verb="read the demo's data at"):
            fs, path = fsspec.core.url_to_fs(url)
            return not fs.exists(f"{path.rstrip('/')}/index.json")
    except AccessRefused:
        raise
    except Exception as err:  # an endpoint that does not answer, a bucket that does not exist, ...
        raise ConfigError(f"--data-url {redact_url(url)}: cannot reach it: {describe(err, ())}") from None


def _summarise(config: DemoConfig) -> None:
    from goodput.ledger import read_events
    from goodput.ledger.plot import plot_report
    from goodput.ledger.report import build_report

    events = list(read_events(config.run_dir))
    every_rank = read_events(config.run_dir, rank=None)
    report = build_report(every_rank, run_dir=config.run_dir, mtbf=config.mtbf if config.faults else None)
    print()
    print(report.render())
    print(_samples_line(config.run_dir))
    timeline = os.path.join(config.run_dir, "timeline.png")
    plot_report(report, timeline)
    loss = os.path.join(config.run_dir, "loss.png")
    _plot_loss(events, loss)
    with open(os.path.join(config.run_dir, "report.json"), "w") as f:
        json.dump(report.to_dict(), f, indent=2, default=str)
    print(
        f"\ntimeline plot:  {timeline}\nloss curve:     {loss}\nreport (JSON):  {config.run_dir}/report.json"
    )
    print(f"read it again:  goodput report {config.run_dir}")


def _samples_line(run_dir: str) -> str:
    """Exactly once, checked from the ranks' sample logs: each step's global batch the last time it was trained
    (whatever world size trained it), and any sample trained in two steps of one epoch."""
    from goodput.verify.demo import global_steps, step_epochs, trained_twice

    folder = os.path.join(run_dir, "samples")
    files = [os.path.join(folder, n) for n in sorted(os.listdir(folder))] if os.path.isdir(folder) else []
    ranks = []
    for path in files:
        with open(path) as f:
            ranks.append(f.readlines())
    steps = global_steps(ranks)
    if not steps:
        return "samples: no step logged"
    sizes = sorted({len(ids) for ids in steps.values()})
    gaps = sorted(set(range(1, max(steps) + 1)) - set(steps))
    return (
        f"samples: {sum(len(ids) for ids in steps.values())} over {len(steps)} steps, "
        f"{'/'.join(map(str, sizes))} a step; {len(trained_twice(steps, step_epochs(ranks)))} trained twice, "
        f"{len(gaps)} steps never trained"
    )


_SPIKE = 3.0  # a loss above this many times the plotted losses' 90th percentile is drawn at the top edge


def loss_range(values: list[float]) -> tuple[float, float]:
    """The loss plot's y range: every finite value but a spike (above ``_SPIKE`` x the 90th percentile), so
    that a 20x loss the guard rolled back does not flatten the curve."""
    ordered = sorted(v for v in values if math.isfinite(v))
    if not ordered:
        return 0.0, 1.0
    limit = _SPIKE * ordered[int(0.9 * (len(ordered) - 1))]
    kept = [v for v in ordered if v <= limit] or ordered
    pad = 0.05 * ((kept[-1] - kept[0]) or abs(kept[-1]) or 1.0)
    return kept[0] - pad, kept[-1] + pad


def loss_history(events: list[dict[str, Any]]) -> tuple[dict[int, float], list[tuple[int, float]]]:
    """Each step's last loss, and every (step, loss) a redo of the step replaced, in order."""
    losses: dict[int, float] = {}
    redone: list[tuple[int, float]] = []
    for event in events:
        if event.get("event") == "step_end" and event.get("loss") is not None:
            step, value = int(event["step"]), float(event["loss"])
            if step in losses:
                redone.append((step, losses[step]))
            losses[step] = value
    return losses, redone


def _plot_loss(events: list[dict[str, Any]], path: str) -> None:
    """The loss of every step that survived (a redone step's last value), against the step; a value off the
    robust range (:func:`loss_range`) is marked at the top edge with its value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses, redone = loss_history(events)
    steps = sorted(losses)
    lo, hi = loss_range([*losses.values(), *(v for _, v in redone)])
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    ax.plot(
        steps, [min(losses[s], hi) for s in steps], lw=1.2, color="#1f77b4", label="training loss (rank 0)"
    )
    if redone:
        ax.scatter([s for s, _ in redone], [min(v, hi) for _, v in redone], s=6, color="#d62728",
                   label="a step's value before it was redone (a failure or a rollback)")  # fmt: skip
    off = sorted((s, v) for s, v in [*redone, *losses.items()] if v > hi)
    if off:
        ax.scatter([s for s, _ in off], [hi] * len(off), marker="^", s=40, color="#d62728", clip_on=False,
                   label="off the scale (a spike)")  # fmt: skip
        for s, v in off:
            ax.annotate(
                f"{v:.3g} at step {s}", (s, hi), textcoords="offset points", xytext=(4, -12), fontsize=8
            )
    ax.set_ylim(lo, hi)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title("goodput demo: byte-level LM on Python's standard library")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
