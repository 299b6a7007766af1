"""`goodput bench data` runs end to end on a tiny configuration and reports the keys the issue names."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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


def test_bench_data_formats_report(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every in-place format against its native loader, on a tiny configuration (figures are not asserted);
    MDS, whose peer (Mosaic Streaming) needs its own venv, reports why it cannot run instead of a ratio."""
    pytest.importorskip("datasets")
    pytest.importorskip("torchdata")
    pytest.importorskip("webdataset")
    from goodput.bench import _formats

    monkeypatch.setenv("GOODPUT_MOSAIC_PYTHON", str(tmp_path / "no-mosaic" / "python"))
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
    assert set(report["formats"]) == set(_formats.BENCHES) >= {"wds", "mds"}
    assert report["formats"]["mds"]["unavailable"].startswith("peer unavailable: no Mosaic Streaming venv")
    measured = {name: r for name, r in report["formats"].items() if name != "mds"}
    for figures in measured.values():
        assert figures["resume"]["goodput"]["state_bytes"] < 4096
        assert set(figures["ratios"]) == {
            "native_resume_over_goodput_resume",
            "goodput_throughput_over_native",
        }
        assert all(value > 0 for value in figures["ratios"].values())
    assert measured["wds"]["resume"]["native"]["state_encoding"] == "json (skip count)"
    assert (
        data.run(_args("--format", "mds", "--rows", "3000", "--position", "2048", "--epoch-samples", "9"))
        == 0
    )
    assert "mds against Mosaic Streaming" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--format takes parquet, arrow, hf, tokens, wds, mds"):
        data.run(_args("--format", "csv"))
    with pytest.raises(ConfigError, match="must be positive and below --rows"):
        data.run(_args("--format", "tokens", "--rows", "10", "--position", "20"))
