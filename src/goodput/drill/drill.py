"""``goodput drill``: the script once uninterrupted, then once per scenario, and a table of what held.

The uninterrupted run is the reference every scenario compares with (``GOODPUT_RECORDS=1``: every step's
samples, loss and random generators, the final state). Each scenario then runs in a folder of its own under the
work folder; the drill's verdict is 0 only when every scenario met its documented outcome.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Sequence

from goodput.drill.runs import LaunchSpec, outcome_text, run_launch
from goodput.drill.scenario import DrillContext, Reference, Scenario, ScenarioResult, registered
from goodput.errors import ConfigError
from goodput.verify.records import RunRecords, read_records

__all__ = ["DEMO_SCRIPT", "drill", "format_table", "reference_run"]

DEMO_SCRIPT = os.path.join(os.path.dirname(__file__), "demo_train.py")


def drill(
    script: Sequence[str],
    *,
    scenarios: Sequence[str] | None = None,
    nproc: int = 2,
    nnodes: int = 1,
    seed: int = 0,
    work_dir: str | None = None,
    as_json: bool = False,
    say: Callable[[str], None] = print,
) -> int:
    """Drill ``script`` (the built-in demo when empty) through ``scenarios`` (every one when None).

    Returns 0 when every scenario met its documented outcome, 1 otherwise (or when the uninterrupted run
    failed). The table (or with ``as_json`` a JSON document) goes to stdout, progress lines to ``say``.

    Raises:
        ConfigError: an unknown scenario, a missing script, a flag out of range, a script without ``Run``.
    """
    chosen = _chosen(scenarios, nnodes)
    if nproc < 1 or nnodes not in (1, 2):
        raise ConfigError(f"need --nproc >= 1 and --nnodes 1 or 2, got --nproc {nproc} --nnodes {nnodes}")
    script = tuple(script) or (DEMO_SCRIPT,)
    if script[0].endswith(".py") and not os.path.isfile(script[0]):
        raise ConfigError(f"the training script {script[0]!r} does not exist")
    work = work_dir or tempfile.mkdtemp(prefix="goodput-drill-")
    if os.path.isdir(work) and os.listdir(work):
        raise ConfigError(f"{work} is not empty (an earlier drill?): choose an empty --work-dir")
    os.makedirs(work, exist_ok=True)
    say(
        f"goodput drill: {' '.join(script)}, {nproc} ranks x {nnodes} node(s), {len(chosen)} scenarios, in {work}"
    )
    say("uninterrupted run (the reference) ...")
    reference = reference_run(script, nproc=nproc, nnodes=nnodes, seed=seed, work=work, say=say)
    if reference is None:
        return 1
    say(
        f"  {reference.steps} steps in {reference.seconds:.0f}s, saved at {list(reference.saves) or 'no step'}"
    )
    results: dict[str, ScenarioResult] = {}
    for n, scenario in enumerate(chosen, 1):
        say(f"[{n}/{len(chosen)}] {scenario.name}: {scenario.injects}")
        folder = os.path.join(work, scenario.name)
        os.makedirs(folder)
        context = DrillContext(
            script=script, nproc=nproc, nnodes=nnodes, seed=seed, work_dir=folder, reference=reference, say=_indent(say)
        )  # fmt: skip
        results[scenario.name] = scenario.run(context)
        row = results[scenario.name]
        say(
            f"  {'ok' if row.met else 'FAILED'}: {row.outcome}"
            + (f" ({row.problems[0]})" if row.problems else "")
        )
    if as_json:
        document = {"script": list(script), "work_dir": work, "reference_seconds": reference.seconds,
                    "scenarios": {name: _row_json(chosen, name, row) for name, row in results.items()}}  # fmt: skip
        print(json.dumps(document, indent=2))
    else:
        print(format_table(results))
        for name, row in results.items():
            for problem in row.problems:
                print(f"{name}: {problem}")
    return 0 if all(row.met for row in results.values()) else 1


def _chosen(names: Sequence[str] | None, nnodes: int) -> list[Scenario]:
    known = registered()
    if names is None:
        return [s for s in known.values() if s.nnodes <= nnodes]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ConfigError(f"unknown scenario {', '.join(unknown)}: choose from {', '.join(known)}")
    needs = [name for name in names if known[name].nnodes > nnodes]
    if needs:
        raise ConfigError(f"scenario {', '.join(needs)} needs --nnodes {known[needs[0]].nnodes}")
    return [known[name] for name in names]


def _indent(say: Callable[[str], None]) -> Callable[[str], None]:
    return lambda line: say(f"  {line}")


def reference_run(
    script: tuple[str, ...], *, nproc: int, nnodes: int, seed: int, work: str, say: Callable[[str], None]
) -> Reference | None:
    """Run the script uninterrupted; None (and why, said) when it fails."""
    from goodput.ledger import read_events

    empty = Reference(
        run_dir="", records=RunRecords({}, {}, []), steps=0, saves=(), async_saves=False, seconds=0.0
    )
    run_dir = os.path.join(work, "uninterrupted")
    bootstrap = DrillContext(
        script=script, nproc=nproc, nnodes=nnodes, seed=seed, work_dir=run_dir, reference=empty, say=say
    )
    done = run_launch(bootstrap, run_dir, LaunchSpec(restarts=0))
    if done.status != 0:
        say(f"the uninterrupted run {outcome_text(done.status)}; its output is in {run_dir}/output.log")
        return None
    try:
        records = read_records(run_dir)
    except FileNotFoundError:
        records = RunRecords({}, {}, [])
    if not any(records.steps.values()):
        raise ConfigError(
            f"{script[0]} recorded no step: train with goodput.Run and call run.step_done() after each step"
        )
    events = read_events(run_dir)
    saves = tuple(sorted({int(e["step"]) for e in events if e["event"] == "checkpoint_durable"}))
    strategies = {e.get("strategy") for e in events if e["event"] == "checkpoint_config"}
    steps = max(max(s, default=0) for s in records.steps.values())
    return Reference(
        run_dir=run_dir, records=records, steps=steps, saves=saves, async_saves="dcp_async" in strategies,
        seconds=done.seconds,
    )  # fmt: skip


def _yes_no(value: bool | None, reason: str = "") -> str:
    if value is None:
        return f"not expected: {reason}" if reason else "-"
    return "yes" if value else "no"


def _row(name: str, r: ScenarioResult) -> tuple[str, ...]:
    identical = _yes_no(r.identical, r.not_expected)
    met = "yes" if r.met else "NO"
    lost = f"{r.time_lost:.1f}s"
    return (name, met, r.injected, r.outcome, _yes_no(r.exactly_once), identical, lost, r.ledger)


def format_table(results: dict[str, ScenarioResult]) -> str:
    """The drill's table: one row per scenario, columns as wide as their widest cell."""
    header = ("scenario", "met", "injected", "outcome", "exactly once", "identical", "time lost", "ledger")
    rows = [header] + [_row(name, r) for name, r in results.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _row_json(chosen: list[Scenario], name: str, row: ScenarioResult) -> dict[str, object]:
    scenario = next(s for s in chosen if s.name == name)
    return {"documented_outcome": scenario.outcome, **dataclasses.asdict(row)}
