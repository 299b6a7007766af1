"""Growing across nodes under real processes (two agents on this machine, c10d rendezvous on 127.0.0.1): a
``goodput launch`` with the same endpoint and id that comes later is admitted by a new round of torch's
rendezvous (the running agent sees it waiting, as torchrun's agent does); its spare is taken in at a step
boundary and receives the state from a replica. Either a job started on fewer nodes than MAX (``--nnodes 1:2``)
or a node lost whole and launched again (``--nnodes 2``: shrink, then grow back). Every sample of the epoch once,
the global batch kept, and the final state bit for bit that of a run whose world size changed at the same steps
through checkpoints."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from goodput.drill.node import free_port, lose_node
from goodput.job.signals import descendants
from tests.warm.test_shrink import SCRIPT, _events, _per_step, _records, _same_as_reference, _schedule
from tests.warm.test_shrink_nodes import _listening, _trained, _wait

pytestmark = pytest.mark.slow

STEPS = 24
# a round with fewer than MAX nodes closes 1 s after the MIN-th joined; a node is dead after 3 missed 1 s beats
RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
PAUSE = "slow@step=6,seconds=3"


def _node(
    run_dir: str,
    endpoint: str,
    node: int,
    nnodes: str = "1:2",
    hold: str = "8",
    faults: str = "",
    spare_after: int = 0,
    extra: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """One node's launch; before step ``hold`` a group smaller than MAX nodes waits for the grow (so that the
    run does not end first)."""
    cmd = [sys.executable, "-m", "goodput", "launch", "--restart", "warm", "--nnodes", nnodes, "--nproc", "1"]
    cmd += ["--rdzv-endpoint", endpoint, "--rdzv-id", "grow-nodes", "--run-dir", run_dir, "--spares", "0"]
    cmd += ["--shrink-after", "0", "--collective-timeout", "4", "--faults", faults, *extra]
    cmd += ["--", SCRIPT, "--steps", str(STEPS), "--spare-after-step", str(spare_after)]
    cmd += ["--hold-for-grow", hold, "--step-seconds", "0.05"] if hold else ["--hold-for-spare", "4"]
    with open(os.path.join(run_dir, f"node-{node}.log"), "ab") as log:
        env = {**os.environ, "PET_RDZV_CONF": RDZV_CONF}
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def _agent_events(run_dir: str) -> list[str]:
    """The names of the events the warm agents wrote, in order."""
    with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
        return [json.loads(line)["event"] for line in f]


def _logs(run_dir: str) -> str:
    """The last 3,000 characters of each node's log (for an assertion's message)."""
    text = ""
    for node in (0, 1):
        with open(os.path.join(run_dir, f"node-{node}.log")) as f:
            text += f.read()[-3000:]
    return text


def test_a_node_that_joins_later_is_taken_in_at_a_step_boundary(tmp_path: os.PathLike[str]) -> None:
    run_dir, ref_dir = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "ref")
    os.makedirs(run_dir)
    endpoint = f"127.0.0.1:{free_port()}"
    procs = [_node(run_dir, endpoint, 0)]
    try:
        _wait("the store to listen", lambda: _listening(endpoint), procs)
        _wait("step 3 on one node", lambda: _trained(run_dir, 3), procs)
        joined = time.monotonic()
        procs.append(_node(run_dir, endpoint, 1))
        status = [proc.wait(timeout=150) for proc in procs]
        grown = time.monotonic() - joined
    finally:
        for proc in procs:
            proc.kill()
    assert status == [0, 0], _logs(run_dir)
    schedule = _schedule(_per_step(run_dir))  # every step's global batch of 12, no sample twice
    assert [world for _, world in schedule] == [1, 2] and schedule[1][0] >= 8, schedule
    events = _agent_events(run_dir)
    assert "rendezvous_round" in events and "grow" in events and "cold_restart" not in events, events
    grows = _events(run_dir, "grow")
    assert sorted((e["rank"], e["world_before"], e["world_after"]) for e in grows) == [(0, 1, 2), (1, 1, 2)]
    # the first node's process trained on through the grow: no restart
    records = _records(run_dir)
    assert len({r["pid"] for r in records if r["samples"] and r["world"] == 1}) == 1
    assert grown < 90, grown
    _same_as_reference(run_dir, ref_dir, STEPS)


def test_a_lost_node_launched_again_grows_the_shrunk_job_back(tmp_path: os.PathLike[str]) -> None:
    run_dir, ref_dir = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "ref")
    os.makedirs(run_dir)
    endpoint = f"127.0.0.1:{free_port()}"
    # every rank pauses at step 6, where the node is lost; the shrunk group waits for the grow before step 12
    again = {"nnodes": "2", "hold": "12"}
    procs = [_node(run_dir, endpoint, 0, faults=PAUSE, **again)]  # the first one hosts the rendezvous store
    try:
        _wait("the store to listen", lambda: _listening(endpoint), procs)
        procs.append(_node(run_dir, endpoint, 1, faults=PAUSE, **again))
        _wait("step 6 on two nodes", lambda: _trained(run_dir, 6, ranks=2), procs)  # in the pause
        lose_node(procs[1])
        _wait("a step on one node", lambda: any(r["world"] == 1 for r in _records(run_dir)), procs[:1])
        procs[1] = _node(run_dir, endpoint, 1, **again)  # the same command on the same machine
        status = [proc.wait(timeout=150) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert status == [0, 0], _logs(run_dir)
    schedule = _schedule(_per_step(run_dir))  # every step's global batch of 12, no sample twice
    assert [world for _, world in schedule] == [2, 1, 2], schedule
    assert 6 <= schedule[1][0] <= 8 and schedule[2][0] >= 12, schedule
    events = _agent_events(run_dir)
    assert "cold_restart" not in events and "cold_restart_followed" not in events, events
    assert [e for e in events if e in ("shrink", "rendezvous_round", "grow")] == [
        "shrink",
        "rendezvous_round",
        "grow",
    ], events
    # in place: the first node's process trained through the shrink and the grow
    records = _records(run_dir)
    assert len({r["pid"] for r in records if r["samples"] and r["world"] == 1}) == 1
    _same_as_reference(run_dir, ref_dir, STEPS)


def _agent_of(launcher: subprocess.Popen[bytes]) -> int:
    """The warm agent (``python -m goodput.warm``) that ``launcher`` started."""
    for pid in descendants(launcher.pid):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"goodput.warm" in f.read().split(b"\0")[:4]:
                return pid
    raise AssertionError(f"no warm agent under launcher {launcher.pid}")


def test_a_node_dropped_by_the_rendezvous_while_it_stalled_still_admits_the_lost_node(
    tmp_path: os.PathLike[str],
) -> None:
    """Node 1 is lost whole, and node 0's agent stalls longer than the keep-alive allows (3 missed 1 s beats;
    here a SIGSTOP of 5 s). torch's rendezvous then drops node 0 too and never beats for it again; node 1's
    command, run again, waits as the next round's only participant. Node 0's agent must see that the
    rendezvous no longer lists it and join that round: the job grows back and completes, instead of node 1
    timing out in the rendezvous while node 0 trains alone."""
    run_dir, ref_dir = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "ref")
    os.makedirs(run_dir)
    endpoint = f"127.0.0.1:{free_port()}"
    again = {"nnodes": "2", "hold": "12", "extra": ("--rdzv-timeout", "40s")}
    procs = [_node(run_dir, endpoint, 0, faults=PAUSE, **again)]
    try:
        _wait("the store to listen", lambda: _listening(endpoint), procs)
        procs.append(_node(run_dir, endpoint, 1, faults=PAUSE, **again))
        _wait("step 6 on two nodes", lambda: _trained(run_dir, 6, ranks=2), procs)
        lose_node(procs[1])
        _wait("a step on one node", lambda: any(r["world"] == 1 for r in _records(run_dir)), procs[:1])
        agent = _agent_of(procs[0])
        os.kill(agent, signal.SIGSTOP)
        try:
            # the stall: outlast the keep-alive's 3 s (polled: a stopped process shows state T)
            stopped = time.monotonic()
            _wait("the agent to stop", lambda: _state(agent) == "T", procs[:1])
            # a stall is wall time: there is nothing to wait on
            time.sleep(max(0.0, 5.0 - (time.monotonic() - stopped)))
        finally:
            os.kill(agent, signal.SIGCONT)
        procs[1] = _node(run_dir, endpoint, 1, **again)
        # node 1 first: not admitted, it ends with exit 75 after its 40 s rendezvous timeout
        assert procs[1].wait(timeout=150) == 0, _logs(run_dir)
        assert procs[0].wait(timeout=60) == 0, _logs(run_dir)
    finally:
        for proc in procs:
            proc.kill()
    schedule = _schedule(_per_step(run_dir))  # every step's global batch of 12, no sample twice
    assert [world for _, world in schedule] == [2, 1, 2], schedule
    with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
        rounds = [e for e in map(json.loads, f) if e["event"] == "rendezvous_round"]
    assert any(e["dropped"] for e in rounds), rounds  # node 0 joined because it was dropped
    _same_as_reference(run_dir, ref_dir, STEPS)


def _state(pid: int) -> str:
    """The process's state letter in ``/proc/<pid>/stat`` (``T``: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_node_that_joins_as_the_job_ends_is_ended_with_it(tmp_path: os.PathLike[str]) -> None:
    """The joined node's spare is ready only once the last step was trained (before step 4 the one-node group
    waits for that spare's imports), and the first node's final save is slow: the joined node grows the job as
    it ends. Both launches end with 0 together; the joined node's newcomer is ended by its agent,
    neither left waiting for a group that never forms nor restarted cold."""
    run_dir = os.path.join(tmp_path, "run")
    os.makedirs(run_dir)
    endpoint = f"127.0.0.1:{free_port()}"
    final_save = "slow@phase=checkpoint_write,seconds=3"
    procs = [_node(run_dir, endpoint, 0, hold="", faults=final_save, spare_after=STEPS)]
    try:
        _wait("the store to listen", lambda: _listening(endpoint), procs)
        # a node that joins while the first round is open (1 s after node 0's) trains from step 1 in a world of 2
        _wait("step 1 on one node", lambda: _trained(run_dir, 1), procs)
        procs.append(_node(run_dir, endpoint, 1, hold="", spare_after=STEPS))
        status = [procs[0].wait(timeout=150)]
        ended = time.monotonic()
        status.append(procs[1].wait(timeout=150))
        after = time.monotonic() - ended
    finally:
        for proc in procs:
            proc.kill()
    assert status == [0, 0], _logs(run_dir)
    assert _schedule(_per_step(run_dir)) == [(1, 1)]  # every step on one node, each sample once
    events = _agent_events(run_dir)
    assert "rendezvous_round_done" in events and "grow" in events, events
    assert not any(e.startswith("cold_restart") for e in events), events
    assert after < 10, after  # not the re-form timeout (30 s) of a group that never forms
