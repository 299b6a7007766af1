"""``goodput.launch.rendezvous``: torchrun's own error file tells a rendezvous that lost a node from a failed job.
(The real thing, two agents and a SIGKILLed node, is in tests/drill/test_drill_node.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.job.codes import EXIT_PREEMPTED
from goodput.job.folder import PIDS_DIR
from goodput.launch.rendezvous import AGENT_ERROR_FILE, rendezvous_lost
from goodput.testing import free_port


def _agent_error(folder: Path, message: str) -> None:
    # the layout torch's @record writes (ErrorHandler.record_exception)
    data = {"message": {"message": message, "extraInfo": {"py_callstack": "...", "timestamp": "0"}}}
    (folder / AGENT_ERROR_FILE).write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ("RendezvousConnectionError: The connection to the C10d store has failed.",
         "the rendezvous lost the node that hosts its store (10.0.0.1:29500): this node's ranks stopped"),
        ("RendezvousTimeoutError: ",
         "the rendezvous lost a node: none came back within --rdzv-timeout 30s: this node's ranks stopped"),
        ("RendezvousClosedError: ", None),  # another node ended the job: its own status says why
        ("ChildFailedError: train.py FAILED", None),
    ],
)  # fmt: skip
def test_only_a_lost_store_or_a_node_that_did_not_come_back_is_a_lost_node(
    tmp_path: Path, message: str, says: str | None
) -> None:
    _agent_error(tmp_path, message)
    (tmp_path / PIDS_DIR).mkdir()
    (tmp_path / PIDS_DIR / "rank-0").write_text("123")  # the job had started: its ranks registered
    said = rendezvous_lost(str(tmp_path), endpoint="10.0.0.1:29500", timeout=30.0)
    assert (
        said == says if says is None else (said is not None and said.startswith(says) and "(exit 75)" in said)
    )


def test_a_first_round_that_timed_out_says_a_node_never_arrived_not_that_one_was_lost(tmp_path: Path) -> None:
    _agent_error(tmp_path, "RendezvousTimeoutError: ")  # no rank of this launch ever started
    said = rendezvous_lost(str(tmp_path), endpoint="10.0.0.1:29500", timeout=30.0)
    assert said is not None and "lost" not in said
    assert said.startswith(
        "the rendezvous never gathered every node: one did not arrive within --rdzv-timeout 30s"
    )
    assert "--rdzv-endpoint 10.0.0.1:29500" in said


def test_no_error_file_or_an_unreadable_one_is_no_lost_node(tmp_path: Path) -> None:
    assert rendezvous_lost(str(tmp_path), endpoint="h:1", timeout=1.0) is None
    (tmp_path / AGENT_ERROR_FILE).write_text("{not json")
    assert rendezvous_lost(str(tmp_path), endpoint="h:1", timeout=1.0) is None


@pytest.mark.slow
def test_a_node_alone_in_its_first_round_stops_saying_the_others_never_arrived(tmp_path: Path) -> None:
    """One node of a two-node job, the other never started: torchrun's first round times out."""
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('no rank may start: the job never formed')\n")
    endpoint = f"127.0.0.1:{free_port()}"
    cmd = [
        sys.executable,
        "-m",
        "goodput",
        "launch",
        "--nnodes",
        "2",
        "--nproc",
        "1",
        "--rdzv-endpoint",
        endpoint,
    ]
    cmd += ["--rdzv-timeout", "3s", "--run-dir", str(tmp_path / "run"), "--", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [
        "goodput launch: the rendezvous never gathered every node: one did not arrive within --rdzv-timeout 3s;"
        f" start the same command, with --rdzv-endpoint {endpoint}, on every node (exit 75: a scheduler may requeue)"
    ], proc.stderr[-3000:]
