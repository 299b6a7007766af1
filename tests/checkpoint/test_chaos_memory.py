"""Chaos with the memory tier: SIGKILLs inside memory-tier writes, replication and restore, and the loss of a
whole node of a two-agent job. Each run must complete, train every sample exactly once per step, and end
bitwise identical to an uninterrupted run; restores must really come from the memory tier (or, after the
node loss, from the peer node's replica)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from goodput.demo.verify_train import train
from goodput.ledger import read_events
from goodput.ledger.report import load_report
from goodput.testing import free_port
from goodput.verify.demo import first_difference, read_run
from tests.helpers import demo

pytestmark = pytest.mark.slow

STEPS, EVERY, MEMORY_EVERY = demo.STEPS, 8, 2  # compared with the shared demo_reference (saves every 4)


def _train(run_dir: str, data: str, faults: str, **overrides: object) -> int:
    settings: dict[str, object] = {
        "nproc": demo.NPROC, "steps": STEPS, "every": EVERY, "strategy": demo.STRATEGY, "seed": demo.SEED,
        "max_restarts": 4,
        "memory_every": str(MEMORY_EVERY),
    }  # fmt: skip
    settings.update(overrides)
    return train(run_dir, data=data, faults=faults, **settings)  # type: ignore[arg-type]


def _restores(run_dir: str) -> list[tuple[int, str]]:
    """(step, tier) of each attempt's restore (by any rank: a rank killed inside its restore records none)."""
    by_attempt = {
        int(e["attempt"]): (int(e["step"]), str(e["tier"]))
        for e in read_events(run_dir)
        if e["event"] == "checkpoint_restored"
    }
    return [by_attempt[a] for a in sorted(by_attempt)]


def test_kills_inside_memory_writes_and_restore_change_nothing(
    demo_reference: tuple[str, str], tmp_path: os.PathLike[str]
) -> None:
    data, clean = demo_reference
    run_dir = os.path.join(tmp_path, "killed")
    plan = "kill@phase=memory_write,step=11,rank=1; kill@phase=memory_restore,rank=0,attempt=1; kill@step=27,rank=0"
    assert _train(run_dir, data, plan) == 0
    assert sorted(os.listdir(os.path.join(run_dir, "faults"))) == [
        "kill@rank=0,phase=memory_restore,attempt=1#0-rank0",
        "kill@step=11,rank=1,phase=memory_write#0-rank1",
        "kill@step=27,rank=0#0-rank0",
    ]
    assert first_difference(read_run(clean), read_run(run_dir)) is None
    restores = _restores(run_dir)
    # Killed inside step 12's write on rank 1: the newest step every rank completed is 10, from memory (the
    # durable tier holds only 8); the kill inside that restore repeats it (a rank killed mid-restore may record
    # nothing); the kill after step 27 resumes at 26 (24 when step 26's background write had not finished).
    assert restores[0] == (10, "memory"), restores
    assert set(restores[:-1]) == {(10, "memory")} and restores[-1] in ((26, "memory"), (24, "memory")), (
        restores
    )
    assert os.listdir(os.path.join(run_dir, "shm")) == []  # the finished run removed its memory folder
    tiers = load_report(run_dir).restores_by_tier
    assert set(tiers) == {"memory"} and tiers["memory"]["count"] >= 2, tiers
    assert "restores from memory" in load_report(run_dir).render()


def test_a_lost_node_restores_from_its_peer_replica(
    demo_reference: tuple[str, str], tmp_path: os.PathLike[str]
) -> None:
    """Two torchrun agents (one worker each); node 1 is lost at step 21 (its processes killed, its RAM wiped)
    after a kill inside replication at step 10."""
    data, clean = demo_reference
    run_dir = os.path.join(tmp_path, "two-nodes")
    node = {"nproc": 1, "nnodes": 2, "rdzv_endpoint": f"127.0.0.1:{free_port()}"}
    plan = "kill@phase=memory_replicate,step=10,rank=0; nodeloss@step=21,node=1"
    with ThreadPoolExecutor(2) as pool:
        nodes = [pool.submit(_train, run_dir, data, plan, **node) for _ in range(2)]
        statuses = [n.result(timeout=600) for n in nodes]
    assert statuses == [0, 0]
    assert first_difference(read_run(clean), read_run(run_dir)) is None
    restores = _restores(run_dir)
    assert restores[-1] in ((20, "peer"), (18, "peer")), (
        restores
    )  # node 1's RAM is gone: its part came from node 0
    assert restores[0] in ((8, "memory"), (10, "memory")), restores


def test_verify_resume_with_the_memory_tier_and_a_node_loss(tmp_path: os.PathLike[str]) -> None:
    """The command CI runs for the issue's guarantee: two agents, node 1 lost (its RAM wiped), its rank restored
    from node 0's replica, and the run bitwise identical to an uninterrupted one."""
    proc = subprocess.run(
        [sys.executable, "-m", "goodput", "verify-resume", "--memory", "2", "--node-loss", "--kills", "0",
         "--steps", "12", "--every", "4", "--work-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "nodeloss@step=" in proc.stdout and "IDENTICAL" in proc.stdout, proc.stdout
    restores = _restores(os.path.join(tmp_path, "interrupted"))
    assert restores and restores[-1][1] == "peer", restores
    assert "restores from peer 1" in proc.stdout


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--memory", "0"], "--memory"),
        (["--node-loss", "--nproc", "3"], "--nproc"),
        (["--node-loss", "--", "x.py"], "--node-loss"),
    ],
)
def test_verify_resume_rejects_bad_memory_and_node_loss_flags(flags: list[str], names: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "goodput", "verify-resume", *flags], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and names in proc.stderr, proc.stderr
