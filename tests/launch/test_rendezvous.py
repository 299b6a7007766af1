"""``goodput.launch.rendezvous``: torchrun's own error file tells a rendezvous that lost a node from a failed job.
(The real thing, two agents and a SIGKILLed node, is in tests/drill/test_drill_node.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from goodput.launch.rendezvous import AGENT_ERROR_FILE, rendezvous_lost


def _agent_error(folder: Path, message: str) -> None:
    # the layout torch's @record writes (ErrorHandler.record_exception)
    data = {"message": {"message": message, "extraInfo": {"py_callstack": "...", "timestamp": "0"}}}
    (folder / AGENT_ERROR_FILE).write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ("RendezvousConnectionError: The connection to the C10d store has failed.",
         "the rendezvous lost the node that hosts its store (10.0.0.1:29500)"),
        ("RendezvousTimeoutError: ", "the rendezvous lost a node: none came back within --rdzv-timeout 30s"),
        ("RendezvousClosedError: ", None),  # another node ended the job: its own status says why
        ("ChildFailedError: train.py FAILED", None),
    ],
)  # fmt: skip
def test_only_a_lost_store_or_a_node_that_did_not_come_back_is_a_lost_node(
    tmp_path: Path, message: str, says: str | None
) -> None:
    _agent_error(tmp_path, message)
    assert rendezvous_lost(str(tmp_path), endpoint="10.0.0.1:29500", timeout=30.0) == says


def test_no_error_file_or_an_unreadable_one_is_no_lost_node(tmp_path: Path) -> None:
    assert rendezvous_lost(str(tmp_path), endpoint="h:1", timeout=1.0) is None
    (tmp_path / AGENT_ERROR_FILE).write_text("{not json")
    assert rendezvous_lost(str(tmp_path), endpoint="h:1", timeout=1.0) is None
