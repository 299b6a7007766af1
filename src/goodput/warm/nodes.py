"""The nodes of a multi-node warm job: which global ranks each holds, and which node has gone silent.

A warm generation's ranks are laid out over the nodes (``Layout``: node -> its global ranks, in rank order). A
shrink or grow renumbers the ranks across every node, so the layout travels in the generation's info
(``gen/<g>/info``, field ``nodes``) and every agent and worker takes its place from it: a worker's
``LOCAL_RANK`` is its index among its node's ranks, not ``RANK - first``.

A node lost whole (power, kernel panic: its agent and workers SIGKILLed at once) has no agent left to report
it. Every agent therefore beats: a thread of its own adds 1 to ``node/<n>/beat`` in the job's store every
``BEAT_SECONDS`` (``NodeBeats``), and each agent watches the other nodes' counters. A node whose counter has
not moved for the collective timeout is lost: the same bound a survivor's collective waits for a hung peer.
The counter is compared with itself, never with a clock of another machine. The node that hosts the store
cannot be lost this way (with it goes the store); that case keeps the rendezvous timeout's exit 75.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from goodput.warm.protocol import Layout
from goodput.warm.store import WarmStore

__all__ = [
    "BEAT_SECONDS",
    "Layout",
    "NodeBeats",
    "first_layout",
    "renumbered",
    "wait_for_nodes",
]

BEAT_SECONDS = 0.5
_JOIN_SECONDS = 10.0  # a beat is one store call: a dead host fails it at once, a silent one at its timeout


def first_layout(nnodes: int, nproc: int) -> Layout:
    """Every node's ranks at the job's start: node ``n`` holds ``n * nproc .. n * nproc + nproc - 1``."""
    return {node: [node * nproc + i for i in range(nproc)] for node in range(nnodes)}


def renumbered(layout: Layout, ranks: dict[int, int], added: dict[int, list[int]] | None = None) -> Layout:
    """``layout`` after renumbering its ranks by ``ranks`` (old -> new; a rank not in it is gone) and adding
    ``added`` (node -> new ranks). Nodes left with no rank leave the layout."""
    out: Layout = {}
    added = added or {}
    for node in sorted(set(layout) | set(added)):
        kept = [ranks[rank] for rank in layout.get(node, []) if rank in ranks] + list(added.get(node, []))
        if kept:
            out[node] = sorted(kept)
    return out


class NodeBeats:
    """This node's heartbeat in the job's store, and the other nodes' as this agent last saw them."""

    def __init__(self, connect: Callable[[], WarmStore], node: int) -> None:
        self.node = node
        self._seen: dict[int, tuple[int, float]] = {}  # node -> (counter, monotonic time it last moved)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, args=(connect,), name="goodput-node-beat", daemon=True
        )
        self._thread.start()

    def _beat(self, connect: Callable[[], WarmStore]) -> None:
        try:
            store = connect()  # a connection of its own: the agent's may block in a long store call
            while not self._stop.is_set():
                store.beat(self.node)
                self._stop.wait(BEAT_SECONDS)
        except Exception:  # the store is gone with its host: the rendezvous timeout ends this job
            return

    def silent(self, store: WarmStore, nodes: list[int], seconds: float) -> list[int]:
        """The nodes of ``nodes`` (other than this one) whose beat has not moved for ``seconds``."""
        now = time.monotonic()
        lost = []
        for node in nodes:
            if node == self.node:
                continue
            count = store.beats(node)
            last = self._seen.get(node)
            if last is None or last[0] != count:
                self._seen[node] = (count, now)
            elif now - last[1] >= seconds:
                lost.append(node)
        return lost

    def stop(self) -> None:
        """Stop beating (the agent is leaving), and wait for the thread: one still in a store call when the process
        exits aborts it (SIGABRT)."""
        self._stop.set()
        self._thread.join(timeout=_JOIN_SECONDS)


def wait_for_nodes(store: WarmStore, nodes: Callable[[], int], admit: Callable[[], None]) -> None:
    """Count this node as done and keep its connection up (at most 60 s) until ``nodes()`` nodes are done: one
    agent hosts the rendezvous store, and must not close it before every node's workers are done (the host's
    agent may leave as soon as the count is full: a closed store then means "all done"). Meanwhile ``admit``
    takes a node waiting in the rendezvous into a round (it counts in ``nodes()`` then): one that came as the job
    ended finds it done and leaves with exit 0, instead of timing out in the rendezvous."""
    import torch.distributed as dist

    with contextlib.suppress(dist.DistError):
        store.node_done()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            admit()
            if store.nodes_done() >= nodes():
                break
            time.sleep(0.1)
