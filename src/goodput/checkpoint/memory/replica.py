"""Replication of memory-tier parts to a peer node, over the memory tier's own gloo group.

Nodes form a ring by node number: each rank sends its part to the rank with the same local index on the next
node and receives the part of the rank on the previous node, which it keeps under ``replicas/`` of its own
node's folder. The exchange runs in the memory tier's background thread after this rank's own part is written,
so training never waits for it. At restore, a part that only a peer holds is sent to its rank the same way.
Parts travel as the transfer codec's messages (:mod:`goodput.checkpoint.transfer`): a replica whose bytes
changed on the way is refused before it is written or loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from goodput.checkpoint.memory.store import MemoryStore
from goodput.checkpoint.transfer import Inbox, Message, decode, encode, open_message, receive, send
from goodput.checkpoint.transfer.codec import CHECKSUM
from goodput.errors import CheckpointCorrupt
from goodput.faults import fault_point

__all__ = ["ReplicaLink", "Topology"]


@dataclass(frozen=True)
class Topology:
    """Which node each rank is on: ``nodes[r]`` and ``local[r]`` for every rank r."""

    nodes: list[int]
    local: list[int]

    @property
    def node_count(self) -> int:
        return len(set(self.nodes))

    def buddy(self, rank: int, shift: int) -> int | None:
        """The rank with the same local index on the node ``shift`` places after ``rank``'s (ring by node)."""
        order = sorted(set(self.nodes))
        if len(order) < 2:
            return None
        target = order[(order.index(self.nodes[rank]) + shift) % len(order)]
        for r, (n, lr) in enumerate(zip(self.nodes, self.local, strict=True)):
            if n == target and lr == self.local[rank]:
                return r
        return None


class ReplicaLink:
    """Point-to-point transfers of parts between this rank and its buddies.

    Args:
        group: the memory tier's gloo group (None: one process; nothing is sent).
        send_to: the group rank that keeps this rank's replica (None: no replication).
        receive_from: the group rank whose replica this rank keeps (None: none).
    """

    def __init__(self, group: Any, *, send_to: int | None, receive_from: int | None) -> None:
        self.group = group
        self.send_to = send_to if group is not None else None
        self.receive_from = receive_from if group is not None else None
        self._inbox = Inbox()

    # ---- at every save ----------------------------------------------------------------------------------------
    def exchange(
        self,
        step: int,
        header: Any,
        buffer: torch.Tensor,
        store: MemoryStore,
        *,
        world: int,
        digest: str | None = None,
    ) -> None:
        """Send this rank's staged part to ``send_to`` and keep the part received from ``receive_from``.

        ``digest``: the part's checksum when its write computed it (else the send computes it).
        """
        sending = None
        if self.send_to is not None:
            message = Message.seal(header.to_bytes(), buffer[: header.data_bytes], digest)
            sending = send(message, self.send_to, self.group)
        if self.receive_from is not None:
            self._receive_replica(step, store, world=world)
        if sending is not None:
            sending.wait()

    def _receive_replica(self, step: int, store: MemoryStore, *, world: int) -> None:
        rank = self.receive_from
        assert rank is not None
        part, digest = open_message(receive(rank, self.group, self._inbox))
        store.begin(step, replica=True)
        path = store.part_path(step, rank, replica=True)
        stale = path[: -len(".part")] + ".json"
        if os.path.exists(stale):
            os.remove(stale)  # an earlier attempt's replica of this step: never let its marker vouch for this
        with open(path, "wb") as f:
            f.write(part)
        fault_point("memory_replicate", step)  # the replica is written, not marked
        store.mark(step, rank, world, len(part), digest, replica=True)

    # ---- at restore -------------------------------------------------------------------------------------------
    def send_part(self, store: MemoryStore, step: int, rank: int, *, world: int, dst: int) -> None:
        """Send the replica of ``rank``'s part of ``step`` to ``dst``; an unreadable one is sent as an error."""
        try:
            meta: dict[str, Any] = store.marker(step, rank, world, replica=True)
            blob = store.read(step, rank, replica=True)
        except (CheckpointCorrupt, OSError) as err:
            send(encode({"error": f"the peer's replica is unreadable: {err}"}), dst, self.group).wait()
            return
        send(encode(meta), dst, self.group).wait()
        part = torch.frombuffer(blob, dtype=torch.uint8) if len(blob) else torch.empty(0, dtype=torch.uint8)
        send(Message.seal(b"", part, str(meta[CHECKSUM])), dst, self.group).wait()

    def receive_part(self, *, src: int) -> tuple[dict[str, Any], memoryview]:
        """The marker and bytes of a part a peer sends (see :meth:`send_part`).

        Raises:
            CheckpointCorrupt: the peer could not read its replica, or its bytes changed on the way.
        """
        meta = decode(receive(src, self.group))
        if "error" in meta:
            raise CheckpointCorrupt(meta["error"])
        part, _ = open_message(receive(src, self.group))
        return meta, part
