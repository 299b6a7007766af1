"""`goodput bench data` runs end to end on a tiny configuration and reports the keys the issue names."""

from __future__ import annotations

import argparse
import json

import pytest

from goodput import ConfigError
from goodput.bench import data


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    data.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_bench_data_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert data.run(_args("--steps", "3", "--compute", "1ms", "--hf-resume-at", "0", "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["ratios"]["epoch_over_ideal"]) == {"l_lt_c", "l_eq_c", "l_gt_c"}
    assert set(report["fetch_seconds"]["l_eq_c"]) == {"p50", "p95"}
    assert report["resume"]["state_bytes"] < 4096 and report["resume"]["batches_fetched"] == 1
    assert report["resume"]["position"] == 1_000_000


def test_bench_data_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="--workers must be at least 1"):
        data.run(_args("--workers", "0"))


def test_bench_data_formats_report(capsys: pytest.CaptureFixture[str]) -> None:
    """Every in-place format against its native loader, on a tiny configuration (figures are not asserted)."""
    pytest.importorskip("datasets")
    pytest.importorskip("torchdata")
    from goodput.bench import _formats

    argv = (
        "--format",
        ",".join(_formats.BENCHES),
        "--rows",
        "3000",
        "--position",
        "2048",
        "--epoch-samples",
        "1000",
    )
    assert data.run(_args(*argv, "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["formats"]) == set(_formats.BENCHES)
    for figures in report["formats"].values():
        assert figures["resume"]["goodput"]["state_bytes"] < 4096
        assert set(figures["ratios"]) == {
            "native_resume_over_goodput_resume",
            "goodput_throughput_over_native",
        }
        assert all(value > 0 for value in figures["ratios"].values())
    with pytest.raises(ConfigError, match="--format takes parquet, arrow, hf, tokens"):
        data.run(_args("--format", "csv"))
    with pytest.raises(ConfigError, match="must be positive and below --rows"):
        data.run(_args("--format", "tokens", "--rows", "10", "--position", "20"))
