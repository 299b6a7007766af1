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
