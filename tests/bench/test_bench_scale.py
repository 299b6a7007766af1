"""Bookkeeping of the benchmarks' cost-as-the-work-grows runs: the sizes flag and the growth table, the
durable-write floor's candidates, the synthesized ledger's counts and the report's reading of it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from goodput.bench import _durable_write
from goodput.bench._ledger_synth import synthesize
from goodput.bench._sizes import parse_sizes, scale_table
from goodput.cli import main
from goodput.errors import ConfigError
from goodput.ledger import build_report, load_report, read_events


def test_state_sizes_parse_smallest_first() -> None:
    assert parse_sizes("2GiB, 256MiB,1GiB") == [256 << 20, 1 << 30, 2 << 30]
    for bad in ("lots", "512KiB", ""):
        with pytest.raises(ConfigError, match="--state-size"):
            parse_sizes(bad)


def test_the_bench_commands_refuse_a_bad_size_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "checkpoint", "--state-size", "1GiB,lots"]) == 2
    assert main(["bench", "recovery", "--state-size", "1GiB,lots"]) == 2
    assert main(["bench", "ledger", "--report-steps", "100,x"]) == 2
    err = capsys.readouterr().err
    assert err.count("--state-size") == 2 and "--report-steps" in err and "Traceback" not in err


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


def test_the_synthesized_ledger_has_the_counts_it_reports(tmp_path: Path) -> None:
    counts = synthesize(str(tmp_path), steps=95, attempts=5, ranks=3, every=10)
    files = sorted((tmp_path / "ledger").iterdir())
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert counts["files"] == len(files) == 15
    assert counts["events"] == len(lines)
    assert counts["step_events"] == sum(e["event"].startswith("step_") for e in lines) == 2 * 95 * 3
    assert counts["bytes"] == sum(f.stat().st_size for f in files)
    report = load_report(tmp_path)
    assert report.accounting.restarts == counts["failures"] == 4
    assert {e["world_size"] for e in lines if e["event"] == "attempt_start"} == {3}


def test_the_report_parses_only_the_primary_ranks_steps_and_reports_the_same(tmp_path: Path) -> None:
    synthesize(str(tmp_path), steps=200, attempts=4, ranks=4, every=25)
    every_line = read_events(tmp_path, rank=None)
    fast = read_events(tmp_path, rank=None, steps_of=0)
    steps = [e for e in fast if e["event"].startswith("step_")]
    # rank 0's 400 step events, and of every other rank's file only its last step_end (3 ranks x 4 attempts)
    assert sum(e["rank"] == 0 for e in steps) == 400
    assert [e["event"] for e in steps if e["rank"] != 0] == ["step_end"] * 12
    assert load_report(tmp_path).to_dict() == build_report(every_line, run_dir=str(tmp_path)).to_dict()
