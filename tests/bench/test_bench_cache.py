"""`goodput bench cache` runs end to end at a tiny size and prints the ratios it promises (no timing asserted)."""

from __future__ import annotations

import argparse
import json

import pytest

from goodput.cli import bench
from goodput.errors import ConfigError

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="goodput")
    bench.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", "cache", *argv])


def test_tiny_run_prints_every_ratio(capsys, tmp_path) -> None:
    args = _args(
        [
            "--samples",
            "64",
            "--sample-size",
            "4KiB",
            "--shard-size",
            "64KiB",
            "--latency",
            "0.005",
            "--naive-seconds",
            "0.3",
            "--mosaic-python",
            str(tmp_path / "no-mosaic"),
            "--json",
        ]
    )
    assert args.handler(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ratios = result["ratios"]
    assert set(ratios) == {
        "warm_over_local_floor",
        "cold_over_mosaic_cold",
        "mds_cold_over_mosaic_cold",
        "warm_over_mosaic_warm",
        "cold_over_naive",
    }
    assert ratios["warm_over_local_floor"] > 0 and ratios["cold_over_naive"] > 0
    assert ratios["cold_over_mosaic_cold"] is None and ratios["mds_cold_over_mosaic_cold"] is None
    assert "skipped" in result["mosaic_note"]
    assert result["cold_cache_metrics"]["bytes_downloaded"] > 64 * 4096


def test_bad_sizes_are_a_config_error() -> None:
    args = _args(["--samples", "64", "--sample-size", "1MiB", "--shard-size", "64KiB"])
    with pytest.raises(ConfigError, match="shard-size"):
        args.handler(args)
