"""Time to N steps, side by side: goodput against what a user would run instead, under the same failures.

    goodput bench peers [--steps 800] [--schedules 20s,40s,none] [--quick] [--json]
    goodput bench peers --schedules 40s --reference <a kept run's peers-<time> folder> [--json]
    goodput bench peers --schedules none --repeat 3 [--contenders baseline,warm] [--json]
    goodput bench peers --quick --contenders baseline,titan,warm [--json]
    goodput bench peers --schedules 20s,40s --seed 0,1,2 --contenders baseline,warm,shrink,torchft [--json]

One job (the demo's model and data, 2 ranks on CPU), run to ``--steps`` steps by each contender under each
failure schedule. A schedule is drawn once from ``--seed`` (SIGKILLs of a random rank, exponential gaps with the
schedule's mean) and applied from outside the job to every contender alike (``bench/_peers_faults.py``).

Contenders:
- ``baseline``: what a careful user builds from PyTorch alone, as torchtitan does (``bench/_peers_baseline.py``):
  torchrun restarts, DCP ``async_save`` every K steps, per-rank ``StatefulDataLoader`` state. K scales
  torchtitan's defaults (a checkpoint every 500 of 10,000 training steps, 5% of the run) to this job: N / 20.
- ``titan``: the same job checkpointed by torchtitan 0.3.0's own code (``bench/_peers_titan.py``): its
  ``CheckpointManager`` in ``async_mode="async"`` every N / 20 steps, its optimizer and LR-scheduler containers
  and its data loader. torchtitan is installed on first use into a cache folder (``~/.cache/goodput``); where
  it cannot be, the contender is skipped with one line saying why.
- ``cold``: goodput's durable tier (``dcp_async``, ``every="auto"``), restarts by torchrun.
- ``memory``: the same with the memory tier.
- ``warm``: the default demo: memory tier, warm restarts with two hot spares.
- ``shrink``: warm restarts with no spare (``--spares 0 --shrink-after 0``): the survivor trains on alone, with
  the global batch of 2 ranks kept (``--global-batch``), and the job grows back when the replacement is ready.
- ``torchft`` (the ``peers`` extra): the same job on torchft 0.2.0 (``bench/_peers_torchft.py``): one replica
  group per rank, each restarted by its own torchrun, a per-step quorum through torchft's lighthouse (started by
  the bench on 127.0.0.1), live recovery of a restarted group from a healthy one, torchft's sampler.
- ``nvrx`` (the ``peers`` extra): the baseline's script under NVIDIA's resiliency extension 0.4.1 launcher
  (``ft_launcher``, its in-job restarts) instead of torchrun.
- ``bare`` (no faults only): the baseline's loop with no checkpoint at all, the price of no insurance.

For each run: wall time from launch to exit, over the same contender's fault-free run and over the baseline's
under the same schedule; goodput from the run's ledger (``goodput report``'s accounting; the baseline writes the
ledger through a thin wrapper); and samples trained twice or never, from the step records
(``bench/_peers_count.py``: the lineage the final model learned from, against the fault-free order).
``heldout_loss`` is the final model's loss on the corpus's last 1,024 samples, which no contender's data holds
(``bench/_peers_heldout.py``): what the recovery cost in model quality. ``lost_per_failure`` is what each failure cost: the run's wall time minus the same contender's fault-free wall
time, over the failures it received; it is the figure that carries to a cluster, where the cost of a restart
is minutes rather than this machine's seconds.

Without faults, every goodput contender's wall time is also divided by the bare loop's (``no_faults_over_bare``):
shrink's fault-free run is warm restarts with no hot spare, so beside warm's ratio it shows what the two spares'
imports cost on cores the ranks train on, apart from the rest of the insurance.

The fault-free runs can be repeated (``--repeat K``): the contenders run in K interleaved rounds (baseline,
warm, bare, baseline, warm, bare, ...), so that a machine whose load drifts during the bench slows every
contender alike, and each ratio is taken between the medians of the rounds' wall times (each round's own
warm / bare ratio is listed too). The runs of failure schedules are run once per seed: with several seeds
(``--seed 0,1,2``) each ratio against a peer is taken seed by seed, under the very same failures, and its
median over the seeds is reported (``bench/_peers_ratios.py``), with the per-seed values beside it.

A run too long for one sitting is split per schedule: ``--reference`` names the folder a ``--keep`` run left
(its data and its fault-free runs), and the schedules given are run against those fault-free runs instead of
new ones; the columns are the same.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

from goodput.bench._jobs import add_output_arguments, print_result, work_folder
from goodput.bench._peers_count import exactness, lineage, read_records
from goodput.bench._peers_faults import Killer, draw_schedule
from goodput.bench._peers_heldout import heldout_loss, write_split
from goodput.bench._peers_ratios import ratios, summary
from goodput.bench._peers_table import print_table
from goodput.bench._peers_titan_launch import titan_site
from goodput.bench._peers_torchft_launch import lighthouse, peer_available, torchft_group

__all__ = ["CONTENDERS", "add_arguments", "run"]

CONTENDERS = ("baseline", "titan", "cold", "memory", "warm", "shrink", "torchft", "nvrx")
_PEERS = {
    "torchft": "torchft",
    "nvrx": "nvidia_resiliency_ext",
}  # contender: the module the peers extra brings
_NVRX_LAUNCHER = "nvidia_resiliency_ext.fault_tolerance.launcher"
_HERE = os.path.dirname(__file__)
_BASELINE = os.path.join(_HERE, "_peers_baseline.py")
_TITAN = os.path.join(_HERE, "_peers_titan.py")
_DEMO = os.path.join(os.path.dirname(_HERE), "demo", "train.py")
_BATCH = 16  # per rank: the demo's and the baseline's default
_RESTART = {  # how goodput launch answers a failure, per contender
    "cold": ["--restart", "cold"],
    "memory": ["--restart", "cold"],
    "warm": ["--restart", "warm", "--spares", "2"],
    "shrink": ["--restart", "warm", "--spares", "0", "--shrink-after", "0"],
}
_GOALS = {
    "warm_over_baseline_at_40s": "<= 0.85",
    "slowest_over_baseline": "<= 1",
    "no_faults_warm_over_bare": "<= 1.02",
    "goodput_samples_wrong": "== 0",
    "warm_over_torchft_lost_per_failure": "<= 0.5 at 20s and 40s",
    "shrink_over_torchft_lost_per_failure": "<= 1.0 at 20s and 40s",
    "warm_over_baseline_lost_per_failure": "<= 0.2 at 20s and 40s",
    "shrink_over_baseline_lost_per_failure": "<= 0.4 at 20s and 40s",
    "warm_over_torchft_time": "<= 1 at 20s and 40s",
    "step_efficiency": "warm's above torchft's at 15s",
    "no_faults_warm_over_torchft": "<= 1.02",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--steps", type=int, default=None, help="steps every run trains (default 800; 80 with --quick)"
    )
    parser.add_argument(
        "--schedules",
        default=None,
        help="failure schedules: mean times between failures, or none (default 20s,40s,none; 10s,none "
        "with --quick)",
    )
    parser.add_argument(
        "--contenders",
        default=None,
        help="which to run (default: all; torchft and nvrx only where the peers extra is installed; titan "
        "installs torchtitan 0.3.0 into ~/.cache/goodput on first use and is skipped where it cannot)",
    )
    parser.add_argument(
        "--seed",
        default="0",
        help="seed of the failure schedules (default 0); several (0,1,2): each schedule with failures is run "
        "under each, and its ratios are the medians over the seeds",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short check: 80 steps, schedules 10s,none, no bare loop (--steps, --schedules still apply)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the fault-free contenders in this many interleaved rounds and compare medians (default 1)",
    )
    add_output_arguments(parser)
    parser.add_argument(
        "--reference",
        default=None,
        help="a peers-<time> folder a --keep run left: reuse its data and fault-free runs, run only the "
        "schedules given that have failures",
    )


def _schedules(text: str) -> list[tuple[str, float | None]]:
    from goodput.errors import ConfigError
    from goodput.units import parse_duration

    out: list[tuple[str, float | None]] = []
    for name in (s.strip() for s in text.split(",") if s.strip()):
        out.append((name, None if name == "none" else parse_duration(name, what="--schedules")))
    if not any(m is None for _, m in out):
        out.append(("none", None))  # every ratio and exactness count needs the fault-free run
    if any(m is not None and m <= 0 for _, m in out):
        raise ConfigError("--schedules: each mean time between failures must be > 0")
    return sorted(out, key=lambda s: (s[1] is None, s[1] or 0.0))


def _command(contender: str, data: str, run_dir: str, steps: int, mtbf: float | None) -> list[str]:
    if contender in ("baseline", "titan", "bare", "nvrx"):
        every = 0 if contender == "bare" else max(1, steps // 20)
        launcher = _NVRX_LAUNCHER if contender == "nvrx" else "torch.distributed.run"
        cmd = [sys.executable, "-m", launcher, "--standalone", "--nproc-per-node=2"]
        return [
            *cmd,
            "--max-restarts=50",
            _TITAN if contender == "titan" else _BASELINE,
            f"--data={data}",
            f"--steps={steps}",
            f"--every={every}",
        ]
    cmd = [
        sys.executable,
        "-m",
        "goodput",
        "launch",
        "--nproc",
        "2",
        "--max-restarts",
        "50",
        "--run-dir",
        run_dir,
    ]
    cmd += _RESTART[contender]
    cmd += ["--", _DEMO, f"--data={data}", f"--steps={steps}", "--no-progress"]
    cmd += [f"--global-batch={2 * _BATCH}"] if contender == "shrink" else []
    cmd += [f"--mtbf={mtbf}"] if mtbf is not None else []
    return cmd + (["--memory-every=off"] if contender == "cold" else [])


def launch_env(run_dir: str, path: str = "") -> dict[str, str]:
    """A contender's environment: its run folder, ``path`` first on PYTHONPATH (torchtitan's), and torchrun's
    store sharing off. With it on, a restarted attempt meets in the agent's store, which outlives the attempt
    that SIGKILL ended: gloo can read that attempt's rank addresses there and fail ``connectFullMesh`` (refused)
    at every restart."""
    env = dict(os.environ, GOODPUT_RUN_DIR=os.path.abspath(run_dir), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    if path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
    return env


def _launch(
    contender: str, data: str, run_dir: str, steps: int, mtbf: float | None, seed: int, path: str = ""
) -> dict[str, Any]:
    """One run under the schedule: wall seconds, the failures applied, goodput, and the step records; ``path``
    goes first on the run's PYTHONPATH (the titan contender's torchtitan)."""
    os.makedirs(run_dir)
    env = launch_env(run_dir, path)
    schedule = draw_schedule(mtbf, seed=seed, world_size=2, horizon=3600.0)
    with open(os.path.join(run_dir, "launch.log"), "w") as log, contextlib.ExitStack() as stack:
        start = time.monotonic()
        if contender == "torchft":
            server, address = lighthouse(log)
            stack.callback(server.wait)
            stack.callback(server.terminate)
            groups = [
                (
                    torchft_group(data, steps, g),
                    {
                        **{k: v for k, v in env.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"},
                        # torchft's Manager joins the store torchrun's agent serves (MASTER_ADDR/PORT)
                        "REPLICA_GROUP_ID": str(g),
                        "NUM_REPLICA_GROUPS": "2",
                        "TORCHFT_LIGHTHOUSE": address,
                    },
                )
                for g in (0, 1)
            ]
        else:
            groups = [(_command(contender, data, run_dir, steps, mtbf), env)]
        procs = [subprocess.Popen(cmd, stdout=log, stderr=log, env=e) for cmd, e in groups]
        for proc in procs:  # a group left running when another failed or timed out
            stack.callback(proc.wait)
            stack.callback(proc.kill)
        with Killer(run_dir, schedule, start) as killer:
            status = [p.wait(timeout=3600) for p in procs]
        wall = time.monotonic() - start
    if any(status):
        raise RuntimeError(f"{contender} failed with exit status {max(status)}: see {run_dir}/launch.log")
    return {"wall_seconds": round(wall, 2), "kills": killer.fired, **_account(run_dir, mtbf)}


def _account(run_dir: str, mtbf: float | None) -> dict[str, Any]:
    """Goodput from the run's ledger, and where its time went: the report's categories (seconds), restarts,
    reshapes (shrinks and grows in place), durable saves, their background write time and the median step."""
    from goodput.ledger import read_events
    from goodput.ledger.report import build_report

    events = read_events(run_dir, rank=None)
    report = build_report(events, run_dir=run_dir, mtbf=mtbf).to_dict()
    durable = [e for e in events if e.get("event") == "checkpoint_durable" and e.get("rank") == 0]
    value = report["goodput"]
    return {
        "goodput": None if value is None else round(float(value), 4),
        "restarts": report["restarts"],
        "reshapes": len(report["reshapes"]),
        "durable_saves": len(durable),
        "persist_seconds_total": round(float(report["overlap_seconds"] or 0.0), 2),
        "step_median_seconds": round(float(report["step_stats"]["median"]), 4),
        "categories": {k: round(float(v), 2) for k, v in report["categories"].items() if float(v) >= 0.05},
    }


def run(args: argparse.Namespace) -> int:
    from goodput.errors import ConfigError

    if args.steps is None:
        args.steps = 80 if args.quick else 800
    if args.schedules is None:
        args.schedules = "10s,none" if args.quick else "20s,40s,none"
    if args.steps < 20:
        raise ConfigError(f"--steps must be >= 20, got {args.steps}")
    if args.repeat < 1:
        raise ConfigError(f"--repeat must be >= 1, got {args.repeat}")
    try:
        args.seeds = list(dict.fromkeys(int(s) for s in str(args.seed).split(",") if s.strip()))
    except ValueError:
        raise ConfigError(f"--seed: give integers separated by commas (0,1,2), got {args.seed!r}") from None
    if not args.seeds:
        raise ConfigError("--seed: give at least one integer")
    default = [c for c in CONTENDERS if c not in _PEERS or peer_available(_PEERS[c])]
    contenders = [c.strip() for c in (args.contenders or ",".join(default)).split(",") if c.strip()]
    for c in contenders:
        if c in _PEERS and not peer_available(_PEERS[c]):
            raise ConfigError(f"--contenders {c} needs {_PEERS[c]}: pip install 'goodput[peers]'")
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        raise ConfigError(f"--contenders: choose from {', '.join(CONTENDERS)}; unknown: {', '.join(unknown)}")
    if "baseline" not in contenders:
        raise ConfigError("--contenders must include baseline: it is the reference of every ratio")
    schedules = _schedules(args.schedules)
    args.titan_path, args.skipped = "", {}
    if "titan" in contenders:
        try:
            args.titan_path = titan_site()
        except RuntimeError as err:  # the other contenders still run
            contenders.remove("titan")
            args.skipped["titan"] = str(err)
    with work_folder(args.keep, "peers") as work:
        result = _measure(work, contenders, schedules, args)
    print_result(result, args.json, print_table)
    return 0


def _measure(
    work: str, contenders: list[str], schedules: list[tuple[str, float | None]], args: Any
) -> dict[str, Any]:
    os.makedirs(work, exist_ok=True)
    rows: list[dict[str, Any]] = []
    records: dict[tuple[str, str], Any] = {}
    if args.reference:
        data, heldout = os.path.join(args.reference, "data"), os.path.join(args.reference, "heldout")
        rows, records = _reference(args.reference, contenders, args.steps)
        schedules = [s for s in schedules if s[1] is not None]
    else:
        data, heldout = write_split(work)
    several = len(args.seeds) > 1
    for name, mtbf in reversed(schedules):  # "none" first: the references of the exactness counts
        # the fault-free runs in rounds; a schedule with failures once per seed
        for round_, seed in enumerate(args.seeds if mtbf is not None else [args.seeds[0]] * args.repeat):
            for contender in contenders + (["bare"] if mtbf is None and not args.quick else []):
                row: dict[str, Any] = {"schedule": name, "contender": contender}
                row.update({"seed": seed} if several and mtbf is not None else {})
                row.update({"round": round_} if round_ and mtbf is None else {})
                suffix = (
                    f"-{round_}" if round_ and mtbf is None else (f"-seed{seed}" if "seed" in row else "")
                )
                run_dir = os.path.join(work, f"{contender}-{name}{suffix}")
                try:
                    path = args.titan_path if contender == "titan" else ""
                    row.update(_launch(contender, data, run_dir, args.steps, mtbf, seed, path))
                except (RuntimeError, subprocess.TimeoutExpired) as err:  # the other runs still count
                    rows.append({**row, "error": str(err)})
                    continue
                row["heldout_loss"] = heldout_loss(run_dir, heldout)
                trained: Any = read_records(run_dir)
                if mtbf is None and not round_:
                    records[contender, name] = trained
                if (contender, "none") in records:
                    row.update(exactness(trained, records[contender, "none"], args.steps))
                rows.append(row)
                with open(os.path.join(work, "rows.jsonl"), "a") as f:  # progress, for a long run
                    f.write(json.dumps(row) + "\n")
    ratios(rows)
    names = sorted({r["schedule"] for r in rows} | {n for n, _ in schedules})
    drawn = {
        n + (f" seed {seed}" if several and n != "none" else ""): draw_schedule(
            _mtbf(n), seed=seed, world_size=2, horizon=600.0
        )
        for n in names
        for seed in (args.seeds if n != "none" else args.seeds[:1])
    }
    return {
        "steps": args.steps,
        "baseline_every": max(1, args.steps // 20),
        "seed": args.seeds if several else args.seeds[0],
        "reference": args.reference,
        "schedules": drawn,
        "skipped": args.skipped,
        "rows": rows,
        "ratios": summary(rows),
        "goals": _GOALS,
        "unmet_schedules": unmet_schedules(rows),
    }


def unmet_schedules(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Schedule -> why it says nothing: a schedule with failures under which a contender's run ended before the
    first failure was due (its row is a fault-free run; the job is too short for that mean time between failures)."""
    out: dict[str, str] = {}

    def name(r: dict[str, Any]) -> str:
        return r["schedule"] + (f" seed {r['seed']}" if "seed" in r else "")

    for key in dict.fromkeys(name(r) for r in rows if r["schedule"] != "none"):
        spared = [r for r in rows if name(r) == key and "kills" in r and not r["kills"]]
        if spared:
            longest = max(r["wall_seconds"] for r in spared)
            out[key] = (
                f"{', '.join(r['contender'] for r in spared)} received no failure in {longest:.0f} s or less: "
                f"raise --steps so that the job outlasts several of this schedule's failures"
            )
    return out


def _mtbf(name: str) -> float | None:
    from goodput.units import parse_duration

    return None if name == "none" else parse_duration(name, what="--schedules")


def _reference(
    folder: str, contenders: list[str], steps: int
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], Any]]:
    """The fault-free rows and step records of an earlier ``--keep`` run, for the schedules run now."""
    from goodput.errors import ConfigError

    try:
        with open(os.path.join(folder, "rows.jsonl")) as f:
            kept = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as err:
        raise ConfigError(f"--reference {folder}: not a folder a --keep run left ({err})") from None
    rows = [r for r in kept if r["schedule"] == "none" and "samples_twice" in r]
    missing = sorted(set(contenders) - {r["contender"] for r in rows})
    if missing:
        raise ConfigError(f"--reference {folder} has no fault-free run of {', '.join(missing)}: run it first")
    records = {
        (r["contender"], "none"): read_records(os.path.join(folder, f"{r['contender']}-none"))
        for r in rows
        if not r.get("round")
    }
    trained = {len(lineage(records[key], 10**9).get(0, {})) for key in records}
    if trained != {steps}:
        raise ConfigError(f"--reference {folder} trained {sorted(trained)} steps, not --steps {steps}")
    return rows, records
