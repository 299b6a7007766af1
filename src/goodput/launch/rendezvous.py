"""A multi-node job whose rendezvous lost a node: how ``goodput launch`` tells it from a failed job.

torchrun's agent meets the other nodes through the c10d rendezvous, whose store one node hosts. When a node
is lost, the agents that survive it end one of two ways:

* the lost node hosted the store: the next call to it fails (a closed connection at once, a silent one after
  ``read_timeout``) and the agent raises ``RendezvousConnectionError``;
* another node: the survivors' workers fail and their agent waits in a new round for the node to come back,
  up to ``join_timeout``, then raises ``RendezvousTimeoutError``. A node that comes back in time joins, and
  the job goes on.

Either way torchrun exits 1 with a traceback, like a failed script. goodput launch gives torchrun an error file
of its own (``$TORCHELASTIC_ERROR_FILE``, where torch's ``@record`` writes the agent's uncaught exception;
each worker gets its own file from the agent) and reads it: those two errors mean the job lost a node and
nothing of it is wrong, so the surviving node stops with ``EXIT_PREEMPTED`` for the scheduler to requeue, and
the relaunch resumes from the newest checkpoint.
"""

from __future__ import annotations

import json
import os

from goodput.job.codes import EXIT_PREEMPTED
from goodput.job.folder import PIDS_DIR

__all__ = ["AGENT_ERROR_FILE", "ERROR_FILE_ENV", "NEVER_GATHERED", "STORE_HOST_LOST", "rendezvous_lost"]

AGENT_ERROR_FILE = "agent-error.json"  # in the launch folder
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
STORE_HOST_LOST = "the rendezvous lost the node that hosts its store"  # the verdict's words for that case
NEVER_GATHERED = "the rendezvous never gathered every node"  # and for a first round that timed out

_LOST = {
    "RendezvousConnectionError": STORE_HOST_LOST + " ({endpoint})",
    "RendezvousTimeoutError": "the rendezvous lost a node: none came back within --rdzv-timeout {timeout:g}s",
}
_RESUME = (
    ": this node's ranks stopped; requeue the job, or run the same command on every node, to resume from the "
    "newest checkpoint (exit {code})"
)
_NEVER_GATHERED = (
    NEVER_GATHERED + ": one did not arrive within --rdzv-timeout {timeout:g}s; start the "
    "same command, with --rdzv-endpoint {endpoint}, on every node (exit {code}: a scheduler may requeue)"
)


def rendezvous_lost(folder: str, *, endpoint: str, timeout: float) -> str | None:
    """The line to stop with when the launch's agent says its rendezvous lost a node, or never gathered them all
    (None: neither, or it wrote nothing). ``folder``: the launch folder; a launch none of whose ranks ever
    started (no ``pids/`` entry) timed out in its first round: a node never arrived, none was lost."""
    try:
        with open(os.path.join(folder, AGENT_ERROR_FILE)) as f:
            message = str(json.load(f)["message"]["message"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    kind = message.split(":", 1)[0]
    if kind not in _LOST:
        return None
    if kind == "RendezvousTimeoutError" and not _ranks_started(folder):
        return _NEVER_GATHERED.format(endpoint=endpoint, timeout=timeout, code=EXIT_PREEMPTED)
    return (_LOST[kind] + _RESUME).format(endpoint=endpoint, timeout=timeout, code=EXIT_PREEMPTED)


def _ranks_started(folder: str) -> bool:
    try:
        return bool(os.listdir(os.path.join(folder, PIDS_DIR)))
    except OSError:
        return False
