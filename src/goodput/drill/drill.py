"""``goodput drill``: the script once uninterrupted, then once per scenario, and a table of what held.

The uninterrupted run is the reference every scenario compares with (``GOODPUT_RECORDS=1``: every step's
samples, loss and random generators, the final state). Each scenario then runs in a folder of its own under the
work folder; the drill's verdict is 0 only when every scenario met its documented outcome.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import textwrap
from collections.abc import Callable, Mapping, Sequence

from goodput.drill.runs import LaunchSpec, outcome_text, run_launch
from goodput.drill.scenario import DrillContext, Reference, Scenario, ScenarioResult, registered
from goodput.errors import ConfigError
from goodput.run.watchdog import HANG_TIMEOUT
from goodput.verify.records import RunRecords, read_records

__all__ = [
    "DEMO_HANG_TIMEOUT",
    "DEMO_SCRIPT",
    "TABLE_WIDTH",
    "aligned",
    "drill",
    "format_table",
    "reference_run",
]

DEMO_SCRIPT = os.path.join(os.path.dirname(__file__), "demo_train.py")
DEMO_HANG_TIMEOUT = 10.0  # the built-in script's default --hang-timeout: a short one, for the hang scenario


def drill(
    script: Sequence[str],
    *,
    scenarios: Sequence[str] | None = None,
    nproc: int = 2,
    nnodes: int = 1,
    seed: int = 0,
    work_dir: str,
    as_json: bool = False,
    wide: bool = False,
    say: Callable[[str], None] = print,
) -> int:
    """Drill ``script`` (the built-in demo when empty) through ``scenarios`` (every one when None).

    Returns 0 when every scenario met its documented outcome, 1 otherwise (or when the uninterrupted run
    failed). The table (or with ``as_json`` a JSON document) goes to stdout, progress lines to ``say``: first
    how long the drill takes. The table fits :data:`TABLE_WIDTH` columns (``wide``: one line per scenario).

    Raises:
        ConfigError: an unknown scenario, a missing script, a flag out of range, a script without ``Run``.
    """
    chosen = _chosen(scenarios, nnodes)
    if nproc < 1 or nnodes not in (1, 2):
        raise ConfigError(f"need --nproc >= 1 and --nnodes 1 or 2, got --nproc {nproc} --nnodes {nnodes}")
    script = tuple(script) or (DEMO_SCRIPT,)
    if script[0].endswith(".py") and not os.path.isfile(script[0]):
        raise ConfigError(f"the training script {script[0]!r} does not exist")
    if os.path.isdir(work_dir) and os.listdir(work_dir):
        raise ConfigError(f"{work_dir} is not empty (an earlier drill?): choose an empty --work-dir")
    os.makedirs(work_dir, exist_ok=True)
    work = work_dir
    say(
        f"goodput drill: {' '.join(script)}, {nproc} ranks x {nnodes} node(s), {len(chosen)} scenarios, in {work}"
    )
    say(f"it takes about {_expected(chosen, script)}")
    say("uninterrupted run (the reference) ...")
    reference = reference_run(script, nproc=nproc, nnodes=nnodes, seed=seed, work=work, say=say)
    if reference is None:
        return 1
    say(
        f"  {reference.steps} steps in {reference.seconds:.0f}s, saved at {list(reference.saves) or 'no step'};"
        f" the scenarios take about {_expected(chosen, script, reference.seconds)}"
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
        print(format_table(results, wide=wide))
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


def _hang_timeout(script: tuple[str, ...]) -> tuple[float, str]:
    """The script's hang timeout, as far as the drill knows it before running it, and where it comes from."""
    if script[0] == DEMO_SCRIPT:
        parser = argparse.ArgumentParser(add_help=False)
        parser.add_argument("--hang-timeout", type=float, default=DEMO_HANG_TIMEOUT)
        return parser.parse_known_args(script[1:])[0].hang_timeout, "the built-in script's"
    return HANG_TIMEOUT, "Run's default"


def _expected(chosen: list[Scenario], script: tuple[str, ...], seconds: float | None = None) -> str:
    """How long the drill takes: in uninterrupted runs of the script (``seconds`` None: none ran yet), or the
    scenarios' time with an uninterrupted run of ``seconds``; and the hang timeouts the scenarios wait besides."""
    runs, timeouts = sum(s.runs for s in chosen), sum(s.hang_timeouts for s in chosen)
    timeout, source = _hang_timeout(script)
    waits = _minutes(timeouts * timeout)
    if seconds is not None:
        total = _minutes(runs * seconds + timeouts * timeout)
        return total + (f" ({waits} of it the hang scenario's timeouts)" if timeouts else "")
    spent = f"{runs + 1} times one uninterrupted run of the script"
    if not timeouts:
        return spent
    return (
        f"{spent}, plus {waits} the hang scenario waits for hang timeouts ({timeouts} x {timeout:g} s, {source};"
        " the script's Run(hang_timeout=) sets it)"
    )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _indent(say: Callable[[str], None]) -> Callable[[str], None]:
    return lambda line: say(f"  {line}")


def reference_run(
    script: tuple[str, ...], *, nproc: int, nnodes: int, seed: int, work: str, say: Callable[[str], None],
    env: Mapping[str, str] | None = None, limit: float | None = LaunchSpec.limit,
) -> Reference | None:  # fmt: skip
    """Run the script uninterrupted (``env``: more environment for it; ``limit``: the seconds it may take, None:
    any); None (and why, said) when it fails."""
    from goodput.ledger import read_events

    run_dir = os.path.join(work, "uninterrupted")
    empty = Reference.empty()
    bootstrap = DrillContext(
        script=script, nproc=nproc, nnodes=nnodes, seed=seed, work_dir=run_dir, reference=empty, say=say
    )
    done = run_launch(bootstrap, run_dir, LaunchSpec(restarts=0, env=dict(env or {}), limit=limit))
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


_HEADER = ("scenario", "met", "injected", "outcome", "exactly once", "identical", "time lost", "ledger")
_LONG = ("injected", "identical", "ledger")  # the cells that go below their row in the table that fits
TABLE_WIDTH = 120  # columns of the table without ``wide``: a terminal's usual width


def format_table(results: dict[str, ScenarioResult], *, wide: bool = False) -> str:
    """The drill's table, one row per scenario, columns as wide as their widest cell.

    It fits :data:`TABLE_WIDTH` columns: what was injected, why identity is not expected and the ledger's account
    follow their row, wrapped. ``wide``: every column on the row's one line, however long.
    """
    rows = [_row(name, r) for name, r in results.items()]
    if wide:
        return aligned(_HEADER, rows)
    short = [i for i, name in enumerate(_HEADER) if name not in _LONG or name == "identical"]
    lines = aligned(tuple(_HEADER[i] for i in short), [_short_row(row, short) for row in rows]).splitlines()
    out = lines[:2]
    for row, line in zip(rows, lines[2:], strict=True):
        out.append(line)
        for name in _LONG:
            cell = row[_HEADER.index(name)]
            if cell and (name != "identical" or cell.startswith("not expected")):
                out += textwrap.wrap(
                    f"{name}: {cell}", TABLE_WIDTH, initial_indent=" " * 4, subsequent_indent=" " * 6,
                    break_on_hyphens=False,
                )  # fmt: skip
    return "\n".join(out)


def _short_row(row: tuple[str, ...], columns: list[int]) -> tuple[str, ...]:
    """``row``'s cells of ``columns``, identity that is not expected said as such (its reason goes below)."""
    cells = [row[i] for i in columns]
    identical = [_HEADER[i] for i in columns].index("identical")
    if cells[identical].startswith("not expected"):
        cells[identical] = "not expected"
    return tuple(cells)


def aligned(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A header, a rule and the rows, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _row_json(chosen: list[Scenario], name: str, row: ScenarioResult) -> dict[str, object]:
    scenario = next(s for s in chosen if s.name == name)
    return {"documented_outcome": scenario.outcome, **dataclasses.asdict(row)}
