"""Bookkeeping of the benchmarks' cost-as-the-work-grows runs: the sizes flag and the growth table, the
durable-write floor's candidates, the synthesized ledger's counts and the report's reading of it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from goodput.bench import _durable_write
from goodput.bench._ledger_synth import synthesize
from goodput.bench._sizes import parse_sizes, print_results, scale_table
from goodput.cli import main
from goodput.errors import ConfigError
from goodput.ledger import read_events
from goodput.ledger.report import build_report, load_report
from tests.helpers.commands import refused_in_one_line


def test_state_sizes_parse_smallest_first() -> None:
    assert parse_sizes("2GiB, 256MiB,1GiB") == [256 << 20, 1 << 30, 2 << 30]
    for bad in ("lots", "512KiB", ""):
        with pytest.raises(ConfigError, match="--state-size"):
            parse_sizes(bad)


def test_the_bench_commands_refuse_a_bad_size_list(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused_in_one_line(
        capsys,
        ["bench", "checkpoint", "--state-size", "1GiB,lots"],
        ["bench", "recovery", "--state-size", "1GiB,lots"],
        ["bench", "ledger", "--report-steps", "100,x"],
    )
    assert err.count("--state-size") == 2 and "--report-steps" in err


def test_the_growth_table_flags_superlinear_costs_only() -> None:
    results = [
        {"ratios": {"stall": 1.0, "write": 0.8, "gone": 1.0, "staging": 1.01}},
        {"ratios": {"stall": 1.2, "write": 1.0, "gone": None, "staging": 1.05}},
        {"ratios": {"stall": 0.5, "write": 0.7, "gone": 1.0, "staging": 1.2}},
    ]
    table = scale_table(results, {"stall": True, "write": False, "gone": True}, "staging")
    assert set(table["ratios"]) == {"stall", "write"}  # a ratio missing at one size is left out
    assert table["ratios"]["stall"]["over_smallest"] == pytest.approx([1.0, 1.2, 0.5])
    assert table["ratios"]["stall"]["within"]  # falling is fixed costs amortised
    assert table["ratios"]["write"]["within"]  # a floor over its cost: 0.7 / 0.8 = 0.875 >= 1 / 1.3
    results[2]["ratios"]["stall"] = 1.31
    results[2]["ratios"]["write"] = 0.6
    table = scale_table(results, {"stall": True, "write": False}, "staging")
    assert not table["ratios"]["stall"]["within"] and not table["ratios"]["write"]["within"]
    assert table["staging"] == {"key": "staging", "values": [1.01, 1.05, 1.2], "within": False}


def test_the_results_of_one_size_print_alone_and_of_several_with_their_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = [{"ratios": {"stall": 1.0, "staging_memory_over_state_bytes": 1.1}}]
    print_results([1 << 20], results, {"stall": True}, as_json=True)
    assert json.loads(capsys.readouterr().out) == results[0]
    print_results([1 << 20], results, {"stall": True}, as_json=False)
    assert capsys.readouterr().out == ""  # each result was printed as it came
    results.append({"ratios": {"stall": 1.5, "staging_memory_over_state_bytes": 1.2}})
    sizes = [1 << 20, 1 << 21]
    print_results(sizes, results, {"stall": True}, as_json=True)
    table = scale_table(results, {"stall": True}, "staging_memory_over_state_bytes")
    assert json.loads(capsys.readouterr().out) == {"sizes": sizes, "results": results, "scale": table}
    print_results(sizes, results, {"stall": True}, as_json=False)
    assert "superlinear? (limit" in capsys.readouterr().out and not table["ratios"]["stall"]["within"]


@pytest.mark.parametrize("method", sorted(_durable_write.METHODS))
def test_each_durable_write_puts_exactly_the_bytes_into_new_files(method: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (1, 5000, 3 << 20, 777)]
    base = str(tmp_path / "raw")
    _durable_write.METHODS[method](arrays, base)
    names = sorted(os.listdir(tmp_path))
    written = [(tmp_path / name).read_bytes() for name in names]
    assert sum(len(w) for w in written) == sum(a.nbytes for a in arrays)
    pieces = sorted(a.tobytes() for a in arrays)
    found = []  # every file is whole arrays, back to back
    for data in written:
        while data:
            piece = next(p for p in pieces if data.startswith(p) and p not in found)
            found.append(piece)
            data = data[len(piece) :]
    assert sorted(found) == pieces
    _durable_write.remove(base)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("json_steps", [False, True])
def test_the_synthesized_ledger_has_the_counts_it_reports(tmp_path: Path, json_steps: bool) -> None:
    counts = synthesize(str(tmp_path), steps=95, attempts=5, ranks=3, every=10, json_steps=json_steps)
    files = sorted((tmp_path / "ledger").iterdir())
    events = read_events(tmp_path, rank=None)
    assert counts["files"] == len([f for f in files if f.suffix == ".jsonl"]) == 15
    # the step records beside each JSONL and each attempt's index (the older format had neither)
    assert len(files) == (15 if json_steps else 35)
    assert counts["events"] == len(events)
    assert counts["step_events"] == sum(e["event"].startswith("step_") for e in events) == 2 * 95 * 3
    assert counts["bytes"] == sum(f.stat().st_size for f in files)
    report = load_report(tmp_path)
    assert report.accounting.restarts == counts["failures"] == 4
    assert {e["world_size"] for e in events if e["event"] == "attempt_start"} == {3}


def test_both_formats_and_a_sparse_ledger_report_the_same(tmp_path: Path) -> None:
    """The synthesized run as the ledger writes it now, as the older format wrote it, and with the other
    ranks' step files left as holes: the same events from the first two, the same report from all three."""
    runs = {
        name: synthesize(str(tmp_path / name), steps=400, attempts=4, ranks=3, every=25, **kw)
        for name, kw in (("records", {}), ("json", {"json_steps": True}), ("sparse", {"sparse": True}))
    }
    assert runs["records"]["events"] == runs["json"]["events"]

    # the same events; the synthesized JSON lines hold each save's durable line in file order, before it happens
    def order(e: dict[str, Any]) -> tuple[int, int, float, str]:
        return e["attempt"], e["rank"], e["mono"], e["event"]

    events = {
        name: sorted(read_events(tmp_path / name, rank=None), key=order) for name in ("records", "json")
    }
    assert events["records"] == events["json"]
    reports = {name: load_report(tmp_path / name).to_dict() | {"run_dir": ""} for name in runs}
    assert reports["records"] == reports["json"] == reports["sparse"]


def test_the_report_parses_only_the_primary_ranks_steps_and_reports_the_same(tmp_path: Path) -> None:
    synthesize(str(tmp_path), steps=200, attempts=4, ranks=4, every=25, json_steps=True)
    every_line = read_events(tmp_path, rank=None)
    fast = read_events(tmp_path, rank=None, steps_of=0)
    steps = [e for e in fast if e["event"].startswith("step_")]
    # rank 0's 400 step events, and of every other rank's file only its last step_end (3 ranks x 4 attempts)
    assert sum(e["rank"] == 0 for e in steps) == 400
    assert [e["event"] for e in steps if e["rank"] != 0] == ["step_end"] * 12
    assert load_report(tmp_path).to_dict() == build_report(every_line, run_dir=str(tmp_path)).to_dict()


def test_bench_ledger_keeps_its_ledgers_and_reports_them_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --report-dir the synthesized ledgers stay and a second run reports them without writing them."""
    argv = ["bench", "ledger", "--report-steps", "40,80", "--report-attempts", "2", "--report-ranks", "2",
            "--report-every", "10", "--report-baseline", "0", "--report-dir", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    first = capsys.readouterr().out
    written = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    assert {p.parent.name for p in written if p.name == "counts.json"} == {
        "steps-40.attempts-2.ranks-2.every-10",
        "steps-80.attempts-2.ranks-2.every-10",
    }
    assert main(argv) == 0
    again = capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == written
    for out in (first, again):
        assert "time per event at 80 steps / at 40:" in out
        assert "report of the largest ledger (80 steps" in out
