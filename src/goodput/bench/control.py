"""The control plane as the world grows: one hand-over, a shrink and a grow, and the start, at N ranks.

    goodput bench control --ranks 2,4,8,16 [--json]

For each N, a tiny DDP job (``bench/_restart_train.py --hidden 8``: 273 parameters, so the ranks' compute is
small beside what the warm agent, the store and the group's formation cost) runs under ``goodput launch
--restart warm --nproc N``, with gloo on this machine's CPUs:

* ``warm`` (``--spares 1``): rank 1 is SIGKILLed at step ``--kill-at``; a forked hot spare takes its place.
* ``shrink`` (``--spares 0 --shrink-after 0``): the same kill; the N-1 survivors train on at once, and the job
  grows back to N when the replacement the agent starts is ready.

Each run's figures come from its own records (``bench/_control_runs.py``): the start (launch to every rank's
first step, and its part after the last rank's first attempt began), the recovery's parts over its ranks
(detection, hand-over, re-form, restore: mean and slowest rank) and the failure to the next step, and the
warm store's operations the recovery cost (every rank's ``store_ops`` in its ``warm_restart`` event, plus the
agent's from its decision to the recovery's confirmation), and the share of the machine's CPU that was busy
from the failure to that step (sampled from ``/proc/stat``: near 1, the recovery waited for cores, so its time
grows with the processes sharing them, not with the control plane). The ratios the goals name:
``ops_per_failure_per_rank`` for each N (flat or falling: linear in N or better) and
``handover_at_largest_over_smallest`` (goal <= 2 from 2 to 16 ranks). ``--step-seconds`` adds a sleep to each
step: the ranks then mostly wait, as a rank waits on a GPU, instead of competing for the CPU; 0 measures the
same with every rank stepping as fast as it can.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from goodput.bench import _control_runs as runs
from goodput.bench._jobs import add_output_arguments, launch, print_result, work_folder

__all__ = ["add_arguments", "run"]

SCRIPT = os.path.join(os.path.dirname(__file__), "_restart_train.py")
MODES = {
    "warm": ("--spares", "1"),
    "shrink": ("--spares", "0", "--shrink-after", "0"),
}
KINDS = ("warm", "shrink", "grow")  # the recoveries measured: the warm run's hand-over, the shrink run's two
GOAL_HANDOVER_RATIO = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", default="2,4,8,16", help="world sizes, comma-separated (default 2,4,8,16)")
    parser.add_argument("--modes", default="warm,shrink", help="warm, shrink or both (default warm,shrink)")
    parser.add_argument("--kill-at", type=int, default=100, help="SIGKILL rank 1 at this step (default 100)")
    parser.add_argument("--after", type=int, default=100, help="steps after the kill (default 100)")
    parser.add_argument("--step-seconds", type=float, default=0.05, help="sleep per step (default 0.05)")
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=10.0,
        help="goodput launch --collective-timeout (default 10; see docs/BENCHMARKS.md for why it shows)",
    )
    add_output_arguments(parser)


def parse_ranks(text: str) -> list[int]:
    """``--ranks``: world sizes >= 2, smallest first."""
    from goodput.errors import ConfigError

    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 2:
        raise ConfigError(
            f"--ranks {text!r}: give world sizes of at least 2, comma-separated (e.g. 2,4,8,16)"
        )
    return sizes


def _modes(text: str) -> list[str]:
    from goodput.errors import ConfigError

    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise ConfigError(f"--modes {text!r}: choose from {', '.join(MODES)} (comma-separated)")
    return modes


@contextlib.contextmanager
def _machine(memory: list[int], cpu: list[tuple[float, int, int]]) -> Iterator[None]:
    """Sample the machine every 0.05 s while the block runs: memory in use (KiB), and the CPU's busy and total
    jiffies over all cores (``/proc/stat``) with the wall time."""
    stop = threading.Event()

    def sample() -> None:
        while True:
            with open("/proc/meminfo") as f:
                info = {line.split(":")[0]: int(line.split()[1]) for line in f}
            memory.append(info["MemTotal"] - info["MemAvailable"])
            with open("/proc/stat") as f:
                jiffies = [
                    int(x) for x in f.readline().split()[1:9]
                ]  # user nice system idle iowait irq softirq steal
            cpu.append((time.time(), sum(jiffies) - jiffies[3] - jiffies[4], sum(jiffies)))
            if stop.wait(0.05):
                return

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _launch(n: int, mode: str, run_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    steps = args.kill_at + args.after
    cmd = [sys.executable, "-m", "goodput", "launch", "--restart", "warm", *MODES[mode], "--nproc", str(n)]
    cmd += ["--min-world", str(n - 1)] if mode == "shrink" else []
    cmd += ["--run-dir", run_dir, "--max-restarts", "3", "--collective-timeout", str(args.collective_timeout)]
    cmd += ["--faults", f"kill@step={args.kill_at},rank=1"]
    cmd += ["--", SCRIPT, "--steps", str(steps), "--hidden", "8", "--every", str(10 * steps)]
    # 8 samples per rank; a shrink may train on N-1 ranks (--min-world), so its batch splits over both sizes
    batch = 8 * n if mode == "warm" else n * (n - 1)
    cmd += ["--step-seconds", str(args.step_seconds), "--global-batch", str(batch)]
    samples: list[int] = []
    cpu: list[tuple[float, int, int]] = []
    launched = time.time()
    with _machine(samples, cpu):
        launch(cmd, f"{mode} run at {n} ranks")
    return {
        "launched": launched,
        "wall_seconds": time.time() - launched,
        "memory_gib": runs.memory_used(samples),
        "cpu": cpu,
    }


def measure(n: int, mode: str, run_dir: str, launched: dict[str, Any]) -> dict[str, Any]:
    """One run's figures: its start, its recoveries (warm: the hand-over; shrink: the shrink and the grow)."""
    from goodput.ledger import read_events

    events = sorted(read_events(run_dir, rank=None), key=lambda e: e["wall"])
    agent = runs.agent_events(run_dir)
    result: dict[str, Any] = {
        "wall_seconds": launched["wall_seconds"],
        "memory_gib": launched["memory_gib"],
        **runs.rendezvous(events, launched["launched"]),
        "cold_restarts": sum(1 for e in agent if e["event"] == "cold_restart"),
    }
    for kind in ("warm",) if mode == "warm" else ("shrink", "grow"):
        part = runs.handover(events, kind)
        agent_ops = runs.failure_ops(agent, "warm_restart" if kind == "warm" else kind)
        if part["ranks"]:
            part["cpu_busy"] = runs.busy_share(
                launched["cpu"], part.pop("began_wall"), part.pop("next_step_wall")
            )
            part["agent_store_ops"] = agent_ops
            part["store_ops"] = part["worker_store_ops"] + (agent_ops or 0)
            part["store_ops_per_rank"] = part["store_ops"] / n
        if kind == "warm":
            handed: dict[str, Any] = next((e["handed"][0] for e in agent if e["event"] == "warm_restart"), {})
            part["spare_ready"] = bool(handed.get("ready") and handed.get("forked"))
        result[kind] = part
    return result


def ratios(result: dict[str, Any], sizes: list[int]) -> dict[str, Any]:
    """The goals' ratios: store operations per failure per rank at each N, and hand-over time at the largest
    N over the smallest (the failure to the next step)."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        rows = {n: result["by_ranks"][str(n)].get(kind) for n in sizes if kind in result["by_ranks"][str(n)]}
        if not rows:
            continue
        out[f"{kind}_store_ops_per_failure_per_rank"] = {
            str(n): r.get("store_ops_per_rank") for n, r in rows.items() if r
        }
        small, large = rows.get(sizes[0]) or {}, rows.get(sizes[-1]) or {}
        a, b = small.get("to_next_step_seconds"), large.get("to_next_step_seconds")
        out[f"{kind}_at_{sizes[-1]}_over_at_{sizes[0]}"] = b / a if a and b is not None else None
    return out


def run(args: argparse.Namespace) -> int:
    from goodput.errors import ConfigError

    sizes, modes = parse_ranks(args.ranks), _modes(args.modes)
    if args.kill_at < 2 or args.after < 1 or args.step_seconds < 0 or args.collective_timeout <= 0:
        raise ConfigError(
            "--kill-at must be >= 2, --after >= 1, --step-seconds >= 0, --collective-timeout > 0"
        )
    result: dict[str, Any] = {
        "ranks": sizes,
        "modes": modes,
        "kill_at": args.kill_at,
        "step_seconds": args.step_seconds,
        "collective_timeout": args.collective_timeout,
        "by_ranks": {},
    }
    with work_folder(args.keep, "control") as work:
        for n in sizes:
            row: dict[str, Any] = {"runs": {}}
            for mode in modes:
                run_dir = os.path.join(work, f"{mode}-{n}")
                figures = measure(n, mode, run_dir, _launch(n, mode, run_dir, args))
                row.update({kind: figures.pop(kind) for kind in KINDS if kind in figures})
                row["runs"][mode] = figures
            result["by_ranks"][str(n)] = row
    result["ratios"] = ratios(result, sizes)
    result["goals"] = {"handover_largest_over_smallest": f"<= {GOAL_HANDOVER_RATIO:g} (2 -> 16 ranks)"}
    print_result(result, args.json, lambda r: print("\n".join(table(r))))
    return 0


def table(result: dict[str, Any]) -> list[str]:
    """The text form: a line per N and recovery, then the ratios."""
    lines = [
        f"rank 1 SIGKILLed at step {result['kill_at']}; {result['step_seconds']} s sleep per step; gloo, "
        f"--collective-timeout {result['collective_timeout']:g}"
    ]
    lines.append(
        f"{'N':>3} {'what':<7} {'start':>7} {'to step':>8} {'detect':>7} {'max left':>8} {'re-form':>8} "
        f"{'restore':>8} {'ops':>6} {'ops/N':>6} {'mem GiB':>8} {'CPU busy':>8}"
    )
    for n, row in result["by_ranks"].items():
        for kind in KINDS:
            part = row.get(kind)
            if not part:
                continue
            run = row["runs"]["warm" if kind == "warm" else "shrink"]
            lines.append(
                f"{n:>3} {kind:<7} {_f(run['start_to_first_step_seconds']):>7} "
                f"{_f(part.get('to_next_step_seconds')):>8} {_f(part.get('detection_seconds')):>7} "
                f"{_f(part.get('max_left_seconds')):>8} {_f(part.get('reform_seconds')):>8} "
                f"{_f(part.get('restore_seconds')):>8} {part.get('store_ops', '-'):>6} "
                f"{_f(part.get('store_ops_per_rank'), 1):>6} {_f(run['memory_gib'], 2):>8} "
                f"{_f(part.get('cpu_busy')):>8}"
            )
    for name, value in result["ratios"].items():
        if isinstance(value, dict):
            shown = ", ".join(f"{k}: {_f(v, 1)}" for k, v in value.items())
        else:
            shown = _f(value)
        lines.append(f"  {name}: {shown}")
    return lines


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
