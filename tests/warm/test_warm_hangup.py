"""Hanging up a gloo generation (goodput.warm.hangup). With real sockets: only the connections that listeners
opened since the generation began accepted are shut down, and their peers read the end at once, even while
another descriptor of the connection stays open (a forked DataLoader worker's copy). With 4 real gloo ranks
under ``goodput launch``: a rank killed in a collective releases every survivor within seconds, not after the
collective timeout, including the one whose ring neighbours both survived."""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys
from typing import Any

import pytest

from goodput.warm.hangup import Hangup
from tests.helpers import paths


def test_only_the_connections_of_listeners_opened_since_the_generation_began_are_hung_up() -> None:
    before = socket.create_server(("127.0.0.1", 0))  # a server the script had before the generation
    hangup = Hangup()
    group = socket.create_server(("127.0.0.1", 0))  # a group's listener, opened as the generation formed
    peer = socket.create_connection(group.getsockname())  # the peer rank's end
    accepted, _ = group.accept()
    copy = os.dup(accepted.fileno())  # another holder of the connection: closing ours alone would not end it
    client = socket.create_connection(before.getsockname())  # this process's own connection to an old server
    served, _ = before.accept()
    try:
        assert hangup() == 1
        peer.settimeout(10)
        assert peer.recv(1) == b""  # the peer reads the end now, not at a timeout
        client.sendall(b"x")
        served.settimeout(10)
        assert served.recv(1) == b"x"  # untouched, both ways
        served.sendall(b"y")
        client.settimeout(10)
        assert client.recv(1) == b"y"
        hangup()  # again: nothing left to break, and no error
    finally:
        os.close(copy)
        for sock in (before, group, peer, accepted, client, served):
            sock.close()


def _events(run_dir: str, name: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted(glob.glob(os.path.join(run_dir, "ledger", "*.jsonl"))):
        with open(path) as f:
            found += [e for e in map(json.loads, f) if e["event"] == name]
    return found


@pytest.mark.slow
def test_a_rank_killed_in_a_collective_of_four_releases_every_survivor_at_once(
    tmp_path: os.PathLike[str],
) -> None:
    """Rank 1 of 4 dies after step 6, so the survivors block in step 7's all-reduce, where in gloo's ring rank 3
    exchanges with ranks 2 and 0, not with the dead rank. The collective timeout (60 s) is beyond the re-form
    timeout (30 s): a survivor that waited it out would turn the shrink into a cold restart."""
    run_dir = str(tmp_path)
    launch = "--nproc 4 --restart warm --spares 0 --shrink-after 0 --collective-timeout 60"
    cmd = [sys.executable, "-m", "goodput", "launch", *launch.split(), "--run-dir", run_dir]
    cmd += ["--faults", "kill@step=6,rank=1", "--", paths.script("shrink_train.py"), "--steps", "10"]
    cmd += ["--spare-after-step", "1000000"]  # the replacement never becomes ready: the job stays shrunk
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
        assert [json.loads(line)["event"] for line in f] == ["shrink", "warm_restart_done"]
    survivors = [e for e in _events(run_dir, "warm_restart") if e["role"] == "survivor"]
    assert len(survivors) == 3
    # each survivor's time from the agent's detection of the death to its leaving the failed generation
    assert max(e["left_seconds"] for e in survivors) < 5.0, survivors
