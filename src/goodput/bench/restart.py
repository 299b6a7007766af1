"""Restart cost, cold against warm against shrink-and-regrow: the same 2-rank job and state, the same SIGKILLs.

    goodput bench restart --kills 3 [--json]

Runs a small DDP training (``bench/_restart_train.py``: an MLP with dropout, AdamW, an LR schedule, seeded data
through ``ResumableLoader`` with a global batch of 16, a checkpoint every ``--every`` steps) four times under
``goodput launch``: with no faults (the baseline), ``--restart cold`` (torchrun restarts the whole group from
the newest checkpoint), ``--restart warm`` (the survivor keeps its process, a hot spare takes the killed rank,
state comes from the survivor) and ``--restart warm --spares 0 --shrink-after 0`` (no spare: the survivor
trains on alone at once, and the job grows back when the replacement the agent then starts is ready). Each
faulty run gets the same fault plan: ``--kills`` SIGKILLs every ``--between`` steps, alternating ranks.

From the runs' ledgers, for each failure: the time from the failure (the killed rank's ``fault_injected``
event, written just before the kill) to the next productive step (the first ``step_end`` after the
recovery's ``restore_end``), and the steps lost (completed before the failure, redone after it).
``ratios.cold_restart_over_warm_restart`` is the mean cold time over the mean warm time (goal >= 3);
``lost_steps_per_failure`` under warm has the goal <= 1. The warm restart's parts (detection, hand-over,
re-forming the group, restore, first step) are averaged from the workers' ``warm_restart`` events.

The shrink row: ``shrink_over_warm_handover`` is the shrink run's mean failure-to-next-step time over the warm
run's (the hand-over to a spare), with the mean ``reshape`` cost of its shrinks and grows from the report; and
``time_to_n_steps_over_fault_free`` gives each faulty run's wall time to the same number of steps over the
fault-free run's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from goodput.bench._jobs import add_output_arguments, launch, print_result, work_folder

__all__ = ["add_arguments", "run"]

SCRIPT = os.path.join(os.path.dirname(__file__), "_restart_train.py")
_PARTS = ("detection_seconds", "handover_seconds", "reform_seconds", "restore_seconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs per run (default 3)")
    parser.add_argument(
        "--between", type=int, default=200, help="steps between kills (default 200: the new spare is ready)"
    )
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps (default 10)")
    parser.add_argument("--step-seconds", type=float, default=0.05, help="extra time per step (default 0.05)")
    add_output_arguments(parser)


def fault_plan(kills: int, steps_between: int) -> tuple[str, list[int]]:
    """``kills`` SIGKILLs at steps N, 2N, ... (N = ``steps_between``), on ranks 1, 0, 1, ...

    Kills far enough apart that the spare started after one restart is ready (has imported torch) at the next:
    a failure rate that outpaces the spare's start-up is measured as a spare that is not yet warm.
    """
    at = [(i + 1) * steps_between for i in range(kills)]
    return "; ".join(f"kill@step={s},rank={(i + 1) % 2}" for i, s in enumerate(at)), at


MODES = {  # how each contender is launched
    "fault_free": ("--restart", "cold"),
    "cold": ("--restart", "cold"),
    "warm": ("--restart", "warm"),
    "shrink": ("--restart", "warm", "--spares", "0", "--shrink-after", "0"),
}
GLOBAL_BATCH = 16  # 8 per rank on 2 ranks, 16 on the survivor after a shrink


def _launch(mode: str, run_dir: str, faults: str, args: argparse.Namespace, steps: int) -> float:
    cmd = [sys.executable, "-m", "goodput", "launch", *MODES[mode], "--nproc", "2", "--run-dir", run_dir]
    cmd += ["--max-restarts", str(args.kills + 2)]
    cmd += ["--faults", faults] if mode != "fault_free" else []
    cmd += ["--", SCRIPT, "--steps", str(steps), "--global-batch", str(GLOBAL_BATCH)]
    cmd += ["--every", str(args.every), "--step-seconds", str(args.step_seconds)]
    start = time.monotonic()
    launch(cmd, f"{mode} run")
    return time.monotonic() - start


def measure(run_dir: str) -> dict[str, Any]:
    """Per failure: seconds from the failure to the next productive step, and steps lost (from the ledgers)."""
    from goodput.ledger import read_events

    events = sorted(read_events(run_dir, rank=None), key=lambda e: e["wall"])
    faults = [e for e in events if e["event"] == "fault_injected"]
    recoveries = []
    for fault in faults:
        resumed = ("restore_end", "shrink")  # a survivor that shrank may read nothing: it goes on
        restore = next(e for e in events if e["event"] in resumed and e["wall"] > fault["wall"])
        first = next(e for e in events if e["event"] == "step_end" and e["wall"] > restore["wall"])
        recoveries.append(
            {
                "failed_step": fault["step"],
                "restored_step": _restored(restore),
                "lost_steps": fault["step"] - _restored(restore),
                "seconds_to_next_step": first["wall"] - fault["wall"],
            }
        )
    warm = [e for e in events if e["event"] == "warm_restart"]
    first_steps = [e["seconds"] for e in events if e["event"] == "warm_first_step"]
    parts = {p: _mean([float(e[p]) for e in warm]) for p in _PARTS}
    parts["first_step_seconds"] = _mean(first_steps)
    n = max(1, len(recoveries))
    return {
        "failures": len(recoveries),
        "mean_seconds_to_next_step": sum(r["seconds_to_next_step"] for r in recoveries) / n,
        "lost_steps_per_failure": sum(r["lost_steps"] for r in recoveries) / n,
        "recoveries": recoveries,
        "warm_parts": parts if warm else None,
    }


def _restored(event: dict[str, Any]) -> int:
    """The step a recovery went on from (a shrink's ``step`` is the first it trains at the new size)."""
    step = int(event.get("step") or 0)
    return step - 1 if event["event"] == "shrink" else step


def _reshape(run_dir: str) -> dict[str, Any]:
    """The shrink run's shrinks and grows as the report counts them: how many, and their mean costs."""
    from goodput.ledger.report import load_report

    acc = load_report(run_dir).accounting
    figures = acc.capacity
    kinds = [r.kind for r in acc.reshapes]
    return {
        "shrinks": kinds.count("shrink"),
        "grows": kinds.count("grow"),
        "shrink_seconds": figures.shrink_seconds if figures else None,
        "grow_seconds": figures.grow_seconds if figures else None,
        "cold_restarts": acc.restarts,
        "goodput": acc.goodput,
        "capacity_goodput": acc.capacity_goodput,
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def run(args: argparse.Namespace) -> int:
    from goodput.errors import ConfigError

    if args.kills < 1 or args.every < 1 or args.between < 1 or args.step_seconds < 0:
        raise ConfigError("--kills, --every and --between must be >= 1 and --step-seconds >= 0")
    faults, _ = fault_plan(args.kills, args.between)
    steps = args.between * args.kills + 25
    result: dict[str, Any] = {"kills": args.kills, "steps": steps, "faults": faults, "every": args.every}
    with work_folder(args.keep, "restart") as work:
        for mode in MODES:
            run_dir = os.path.join(work, mode)
            wall = _launch(mode, run_dir, faults, args, steps)
            result[mode] = {"wall_seconds": wall, **(measure(run_dir) if mode != "fault_free" else {})}
            if mode == "shrink":
                result[mode]["reshape"] = _reshape(run_dir)
    cold, warm = result["cold"]["mean_seconds_to_next_step"], result["warm"]["mean_seconds_to_next_step"]
    shrink = result["shrink"]["mean_seconds_to_next_step"]
    result["ratios"] = {
        "cold_restart_over_warm_restart": cold / warm if warm > 0 else None,
        "shrink_over_warm_handover": shrink / warm if warm > 0 else None,
        "time_to_n_steps_over_fault_free": {
            m: result[m]["wall_seconds"] / result["fault_free"]["wall_seconds"]
            for m in ("cold", "warm", "shrink")
        },
    }
    result["lost_steps_per_failure"] = {
        m: result[m]["lost_steps_per_failure"] for m in ("cold", "warm", "shrink")
    }
    result["goals"] = {"cold_restart_over_warm_restart": ">= 3", "lost_steps_per_failure_warm": "<= 1"}
    print_result(result, args.json, _print)
    return 0


def _print(result: dict[str, Any]) -> None:
    print(
        f"{result['kills']} SIGKILLs in {result['steps']} steps, 2 ranks, checkpoint every {result['every']}"
    )
    for mode in ("cold", "warm", "shrink"):
        r = result[mode]
        print(
            f"  {mode}: failure -> next step {r['mean_seconds_to_next_step']:.2f} s (mean of {r['failures']}), "
            f"lost steps/failure {r['lost_steps_per_failure']:.1f}, run {r['wall_seconds']:.1f} s"
        )
    parts = result["warm"]["warm_parts"] or {}
    shown = ", ".join(f"{k.removesuffix('_seconds')} {v:.3f} s" for k, v in parts.items() if v is not None)
    print(f"  warm restart parts (mean over ranks): {shown}")
    ratios = result["ratios"]
    print(f"  cold_restart_over_warm_restart = {ratios['cold_restart_over_warm_restart']:.1f} (goal >= 3)")
    shape = result["shrink"]["reshape"]
    print(
        f"  shrink_over_warm_handover = {ratios['shrink_over_warm_handover']:.2f} ({shape['shrinks']} shrinks, mean "
        f"{_seconds(shape['shrink_seconds'])}; {shape['grows']} grows, mean {_seconds(shape['grow_seconds'])}; "
        f"{shape['cold_restarts']} cold restarts)"
    )
    times = ", ".join(f"{m} {v:.2f}" for m, v in ratios["time_to_n_steps_over_fault_free"].items())
    print(
        f"  time to {result['steps']} steps over fault-free ({result['fault_free']['wall_seconds']:.1f} s): {times}"
    )


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"
