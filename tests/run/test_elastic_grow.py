"""Elastic torchrun in place: ``goodput launch --nnodes 1:2`` with two agents on this machine (c10d on 127.0.0.1).

One agent is SIGKILLed for good (its torchrun and its worker): the surviving agent's torchrun restarts its
worker, the rendezvous closes with one node and the job continues on one rank from the two-rank checkpoint.
Then a new agent joins: torchrun sees a node waiting, restarts the worker group, and the job grows back to two
ranks from the one-rank checkpoint. Every sample is trained exactly once over the whole run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import pytest

from goodput.data import ShardedDataset
from goodput.data.order import EpochOrder
from goodput.demo.main import TRAIN_SCRIPT
from goodput.demo.train import parse_args
from goodput.demo.verify_train import prepare_data
from goodput.testing import free_port
from tests.helpers.elastic import BATCH, check_one_numbering, effective_steps

pytestmark = pytest.mark.slow

STEPS, EVERY = 60, 5
# The one-rank attempt (rank 0's attempt 1) pauses at step 25, so the new agent joins before the job ends.
PAUSE = "slow@step=25,seconds=60,attempt=1,rank=0"
# Rendezvous timeouts (torchrun reads --rdzv-conf from PET_RDZV_CONF): a round with fewer than 2 nodes closes
# 10 s after the first joined (long enough for the second agent to start, short enough to go on without a lost
# one; a full round closes at once); a node counts as dead after 3 missed 1 s heartbeats.
RDZV_CONF = "last_call_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=120"


def _agent(run_dir: str, data: str, endpoint: str, log: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "goodput", "launch", "--nproc", "1", "--nnodes", "1:2",
        "--rdzv-endpoint", endpoint, "--rdzv-id", "grow", "--max-restarts", "3", "--run-dir", run_dir,
        "--faults", PAUSE,
        "--", TRAIN_SCRIPT, f"--data={data}", f"--steps={STEPS}", f"--every={EVERY}", "--strategy=dcp",
        "--seed=0", "--workers=1", "--no-progress", "--hang-timeout=60",
    ]  # fmt: skip
    env = {**os.environ, "PET_RDZV_CONF": RDZV_CONF}
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun starts each worker in a session of its own)."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += _children(current)
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _wait(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _listening(endpoint: str) -> bool:
    host, port = endpoint.rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


def _tail(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-3000:]


def _records(run_dir: str) -> list[dict]:
    rows = []
    folder = os.path.join(run_dir, "samples")
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        with open(os.path.join(folder, name)) as f:
            for line in f:
                with contextlib.suppress(json.JSONDecodeError):
                    rows.append(json.loads(line))
    return rows


def test_one_agent_lost_for_good_then_a_new_one_joins(tmp_path: os.PathLike[str]) -> None:
    data = prepare_data(str(tmp_path))
    run_dir = os.path.join(tmp_path, "run")
    endpoint = f"127.0.0.1:{free_port()}"
    logs = [os.path.join(tmp_path, f"agent-{n}.log") for n in "abc"]
    agents = [_agent(run_dir, data, endpoint, logs[0])]
    try:
        _wait("agent a's rendezvous store", lambda: _listening(endpoint), 60)  # a hosts the store
        agents.append(_agent(run_dir, data, endpoint, logs[1]))
        _wait("two ranks training", lambda: any(r["step"] >= 8 for r in _records(run_dir)), 120)
        _kill_tree(agents[1].pid)  # the node is lost: its launcher, torchrun agent and worker
        agents[1].wait(timeout=30)
        first = max(r["attempt"] for r in _records(run_dir))
        _wait("one rank training", lambda: any(r["attempt"] > first for r in _records(run_dir)), 120)
        shrunk = max(r["attempt"] for r in _records(run_dir))
        agents.append(_agent(run_dir, data, endpoint, logs[2]))
        statuses = [agents[0].wait(timeout=300), agents[2].wait(timeout=300)]
    finally:
        for agent in agents:
            if agent.poll() is None:
                _kill_tree(agent.pid)
                agent.wait()
    tails = "\n".join(_tail(p) for p in logs)
    assert statuses == [0, 0], tails
    worlds = check_one_numbering(run_dir)  # every rank of a round records the round's attempt number
    assert worlds[first] == 2 and worlds[shrunk] == 1, (worlds, tails)
    assert worlds[max(worlds)] == 2, (worlds, tails)  # grew back in place
    steps = effective_steps(run_dir)
    assert sorted(steps) == list(range(1, STEPS + 1))
    trained: list[int] = []
    counts = {1: 0, 2: 0}
    for step in range(1, STEPS + 1):
        rows = steps[step]
        world = worlds[rows[0]["attempt"]]
        assert len(rows) == world, (step, rows)
        counts[world] += 1
        trained += [i for r in sorted(rows, key=lambda r: r["rank"]) for i in r["samples"]]
    assert counts[1] > 0 and counts[2] > 0, counts
    assert len(set(trained)) == len(trained) == BATCH * (counts[1] + 2 * counts[2])
    dataset = ShardedDataset(data)
    window = parse_args(["--data", data]).shard_window  # the demo's shard-aware order
    order = EpochOrder(seed=0, epoch=0, size=len(dataset), shard_sizes=dataset.shard_sizes, window=window).at(
        np.arange(len(trained))
    )
    assert set(trained) == set(order.tolist())
    print(f"worlds by attempt {worlds}; steps on 1 rank {counts[1]}, on 2 ranks {counts[2]}")
