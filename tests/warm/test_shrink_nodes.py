"""Shrinking across nodes under real processes: two ``goodput launch --restart warm --nnodes 2`` agents on this
machine (their c10d rendezvous and store on 127.0.0.1), one rank each, no spare. The node that does not host the
store is SIGKILLed whole (its launcher, agent and worker): its heartbeat stops, and the other node's rank trains
on alone, in place (same process, no checkpoint read), with every sample of the epoch once and the final state
bit for bit that of a run whose world size changed at the same step through a checkpoint."""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
import time

import pytest

from goodput.drill.node import free_port, lose_node
from tests.warm.test_shrink import (
    NEVER,
    SCRIPT,
    STEPS,
    _events,
    _per_step,
    _records,
    _same_as_reference,
    _schedule,
)

pytestmark = pytest.mark.slow

PAUSE = "slow@step=6,seconds=3"  # every rank pauses at step 6: the node is lost in that window


def _node(run_dir: str, endpoint: str, node: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "goodput", "launch", "--restart", "warm", "--nnodes", "2", "--nproc", "1"]
    cmd += ["--rdzv-endpoint", endpoint, "--rdzv-id", "shrink-nodes", "--run-dir", run_dir, "--spares", "0"]
    cmd += ["--shrink-after", "0", "--collective-timeout", "4", "--faults", PAUSE]
    cmd += ["--", SCRIPT, "--steps", str(STEPS), "--spare-after-step", NEVER]
    with open(os.path.join(run_dir, f"node-{node}.log"), "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def _listening(endpoint: str) -> bool:
    host, port = endpoint.rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


def _trained(run_dir: str, step: int, ranks: int = 1) -> bool:
    """Whether ``ranks`` processes have recorded ``step`` (or a later one)."""
    if not os.path.isdir(run_dir):
        return False
    return len({r["pid"] for r in _records(run_dir) if r["step"] >= step}) >= ranks


def _wait(what: str, done: object, procs: list[subprocess.Popen[bytes]], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert all(p.poll() is None for p in procs), f"a node ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling for a state, not a synchronisation by time


def test_losing_the_node_that_does_not_host_the_store_shrinks_the_other_in_place(
    tmp_path: os.PathLike[str],
) -> None:
    run_dir, ref_dir = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "ref")
    os.makedirs(run_dir)
    endpoint = f"127.0.0.1:{free_port()}"
    procs = [_node(run_dir, endpoint, 0)]  # the first one started hosts the rendezvous store
    try:
        _wait("the store to listen", lambda: _listening(endpoint), procs)
        procs.append(_node(run_dir, endpoint, 1))
        # both ranks recorded step 6 and pause there: the kill cannot fall between a rank's part of a step's
        # gradient reduction and its record of the step's samples
        _wait("step 6 on both nodes", lambda: _trained(run_dir, 6, ranks=2), procs)
        lost = time.monotonic()
        lose_node(procs[1])
        status = procs[0].wait(timeout=120)
        with open(os.path.join(run_dir, "node-0.log")) as f:
            assert status == 0, f.read()[-4000:]
        finished = time.monotonic() - lost
    finally:
        for proc in procs:
            proc.kill()
    per_step = _per_step(run_dir)  # every step's global batch of 12, no sample twice
    schedule = _schedule(per_step)
    assert [world for _, world in schedule] == [2, 1] and 6 <= schedule[1][0] <= 8, schedule
    records = _records(run_dir)
    # In place: the steps at 1 rank were trained by a process that trained at 2, and nothing was read back
    # (the only checkpoint is the final save of close()).
    assert {r["pid"] for r in records if r["world"] == 1} <= {r["pid"] for r in records if r["world"] == 2}
    saved = {os.path.basename(p) for p in glob.glob(os.path.join(run_dir, "checkpoints", "step-*"))}
    assert saved == {f"step-{STEPS}"}
    shrinks = _events(run_dir, "shrink")
    assert [(e["world_before"], e["world_after"], e["rank"]) for e in shrinks] == [(2, 1, 0)], shrinks
    assert finished < 60, finished
    _same_as_reference(run_dir, ref_dir)
