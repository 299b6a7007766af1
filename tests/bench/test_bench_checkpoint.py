"""``goodput bench checkpoint`` runs end to end under torchrun on a tiny state and reports every ratio."""

from __future__ import annotations

import json

import pytest

from goodput.cli import main

pytestmark = pytest.mark.slow


def test_bench_checkpoint_json_has_every_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "checkpoint", "--state-size", "4MiB", "--saves", "2", "--staging-saves", "3"]
    # windows of at most 20 steps: the figures are not asserted, only that every one is computed, and a window
    # stretched to outlast an async save's background work only made them steadier
    assert main([*argv, "--window", "3", "--max-window", "20", "--step-ms", "5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in (
        "torch_save_stall_over_async_stall",
        "async_stall_over_memcpy_floor",
        "dcp_write_over_raw_write",
        "restore_over_read_floor",
        "s3_write_over_raw_put",
        "s3_restore_over_raw_get",
        "run_step_overhead_over_10ms",
    ):
        assert isinstance(result["ratios"][key], float) and result["ratios"][key] > 0, (key, result)
    # differences of loop time and of resident memory: measured, but on a 4 MiB state they can be noise; an
    # async loss measured as zero or below (a busy machine) has no ratio, as on the idle host below
    lost_ratio = result["ratios"]["torch_save_lost_over_async_lost"]
    if result["strategies"]["dcp_async"]["lost_s"] > 0:
        assert isinstance(lost_ratio, float), result
    else:
        assert lost_ratio is None, result
    assert isinstance(result["ratios"]["staging_memory_over_state_bytes"], float)
    # on an idle host the async loss of a 4 MiB state can measure as zero or below: then there is no ratio
    idle = result["idle_host"]
    assert {"torch_save", "dcp_async", "dcp_async_process"} <= set(idle)
    assert all(isinstance(part["lost_s"], float) for part in idle.values())
    idle_ratio = result["ratios"]["torch_save_lost_over_async_lost_idle_host"]
    if idle["dcp_async"]["lost_s"] > 0:
        assert idle_ratio == pytest.approx(idle["torch_save"]["lost_s"] / idle["dcp_async"]["lost_s"]), idle
    else:
        assert idle_ratio is None
    assert set(result["strategies"]) == {"torch_save", "dcp", "dcp_async"}
    assert result["world_size"] == 2
    assert result["restore"]["bytes_per_rank"] > 0 and result["s3"]["bytes_per_rank"] > 0
    # the durable-write floor is timed on both sides of each dcp save; the drift is the larger over the smaller
    floors = result["floors"]
    assert floors["raw_write_s"] > 0 and floors["raw_write_after_s"] > 0 and floors["raw_write_drift"] >= 1
    assert {"find", "verify", "read", "load", "position"} <= set(result["restore"]["parts_s"]), result
    for numbers in result["strategies"].values():
        assert numbers["bytes"] > 0 and numbers["durable_s"] >= numbers["stall_s"] > 0, result


def test_bench_checkpoint_refuses_a_bad_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "checkpoint", "--state-size", "lots"]) == 2
    assert "--state-size" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("strategies", "said"),
    [("dcp,tape", "unknown: tape"), ("torch_save", "must include dcp or dcp_async")],
)
def test_bench_checkpoint_refuses_strategies_it_cannot_measure(
    capsys: pytest.CaptureFixture[str], strategies: str, said: str
) -> None:
    # the restore is timed on the checkpoint dcp or dcp_async wrote: without either the workers would fail late
    assert main(["bench", "checkpoint", "--strategies", strategies]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
