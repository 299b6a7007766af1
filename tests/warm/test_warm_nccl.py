"""Warm restarts over NCCL, each rank on its own GPU: the same failures as tests/warm/test_warm.py (gloo on CPU).

NCCL needs one GPU per rank, so these tests run only where at least two GPUs exist; CI has none. They check what
only NCCL has: a collective blocked on a dead peer does not fail by itself. Where a rank dies, the collective
timeout is set far beyond the test's own limit, so a run only finishes in time if the survivor's generation
watch aborted its communicators when the agent saw the failure (goodput.warm.watch), and the next
generation formed on fresh communicators with the same backend. Where a rank hangs, NCCL's own timeout must
release the survivor without ending its process.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.warm.test_warm import STEPS, _agent, _assert_warm_and_identical, _final, _launch, _lines, _trained

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        torch.cuda.device_count() < 2,
        reason=f"NCCL warm restarts need 2 GPUs, one per rank; this machine has {torch.cuda.device_count()}",
    ),
]

CUDA = ("--device", "cuda")
NEVER = ("--collective-timeout", "600")  # only the watch's abort can end a blocked collective in time


def _jsonl(folder: str) -> list[str]:
    """The ledger's JSON-lines files in ``folder`` (its step records are binary ``.steps`` files beside them)."""
    return sorted(name for name in os.listdir(folder) if name.endswith(".jsonl"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> str:
    run_dir = str(tmp_path_factory.mktemp("baseline"))
    _launch(run_dir, "", *NEVER, script_args=CUDA)
    return run_dir


def test_sigkill_of_one_rank_aborts_the_survivors_nccl_collective_and_restarts_warm(
    tmp_path: os.PathLike[str], baseline: str
) -> None:
    run_dir = str(tmp_path)
    _launch(run_dir, "kill@step=20,rank=1", *NEVER, script_args=("--step-seconds", "0.01", *CUDA))
    _assert_warm_and_identical(run_dir, baseline)


def test_exception_on_one_rank_restarts_warm_over_nccl(tmp_path: os.PathLike[str], baseline: str) -> None:
    run_dir = str(tmp_path)
    _launch(run_dir, "raise@step=20,rank=1", *NEVER, script_args=("--step-seconds", "0.01", *CUDA))
    _assert_warm_and_identical(run_dir, baseline)


def test_hung_rank_is_replaced_after_nccls_own_timeout_keeps_the_survivor(
    tmp_path: os.PathLike[str], baseline: str
) -> None:
    """A hang: the survivor's all-reduce fails at the collective timeout (4 s) with its process kept
    (TORCH_NCCL_ASYNC_ERROR_HANDLING=2, set by goodput), before the hung rank's watchdog ends it (8 s)."""
    run_dir = str(tmp_path)
    _launch(run_dir, "hang@step=20,rank=1", hang_timeout="8", script_args=CUDA)
    _assert_warm_and_identical(run_dir, baseline)


def test_spare_killed_while_restoring_falls_back_to_a_cold_restart_over_nccl(
    tmp_path: os.PathLike[str], baseline: str
) -> None:
    run_dir = str(tmp_path)
    _launch(run_dir, "kill@step=20,rank=1; kill@phase=restore,rank=1,attempt=1", *NEVER, script_args=CUDA)
    assert [e["event"] for e in _agent(run_dir)] == ["warm_restart", "cold_restart"]
    assert _trained(run_dir)[0] == _trained(baseline)[0]
    assert _final(run_dir)["step"] == int(STEPS)


def test_sharded_model_restarts_warm_from_the_checkpoint_over_nccl(
    tmp_path: os.PathLike[str], baseline: str
) -> None:
    run_dir = str(tmp_path)
    _launch(run_dir, "kill@step=20,rank=1", *NEVER, script_args=("--fsdp", "--strategy", "dcp", *CUDA))
    assert [e["event"] for e in _agent(run_dir)] == ["warm_restart", "warm_restart_done"]
    samples, pids = _trained(run_dir)
    assert len(pids[0]) == 1 and len(pids[1]) == 2
    assert samples == _trained(baseline)[0]
    restored = [
        e["step"]
        for name in _jsonl(os.path.join(run_dir, "ledger"))
        for e in _lines(os.path.join(run_dir, "ledger", name))
        if e["event"] == "restore_end" and e["attempt"] == 1
    ]
    assert restored == [10, 10]
