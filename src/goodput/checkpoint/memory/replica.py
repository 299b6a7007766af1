"""Replication of memory-tier parts to a peer node, over the memory tier's own gloo group.

Nodes form a ring by node number: each rank sends its part to the rank with the same local index on the next
node and receives the part of the rank on the previous node, which it keeps under ``replicas/`` of its own
node's folder. The exchange runs in the memory tier's background thread after this rank's own part is written,
so training never waits for it. At restore, a part that only a peer holds is sent to its rank the same way.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from goodput.checkpoint.memory.format import checksum
from goodput.checkpoint.memory.store import MemoryStore
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


def _bytes_tensor(data: bytes | bytearray) -> torch.Tensor:
    return torch.frombuffer(bytearray(data) if isinstance(data, bytes) else data, dtype=torch.uint8)


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
        self._inbox = torch.empty(0, dtype=torch.uint8)

    def _global(self, rank: int) -> int:
        return int(dist.get_global_rank(self.group, rank))

    # ---- at every save ----------------------------------------------------------------------------------------
    def exchange(
        self, step: int, header: Any, buffer: torch.Tensor, store: MemoryStore, *, world: int
    ) -> None:
        """Send this rank's staged part to ``send_to`` and keep the part received from ``receive_from``."""
        pending = []
        if self.send_to is not None:
            head = _bytes_tensor(header.to_bytes())
            sizes = torch.tensor([head.numel(), header.data_bytes], dtype=torch.int64)
            dst = self._global(self.send_to)
            pending.append(dist.isend(sizes, dst, group=self.group))
            pending.append(dist.isend(head, dst, group=self.group))
            if header.data_bytes:
                pending.append(dist.isend(buffer[: header.data_bytes], dst, group=self.group))
        if self.receive_from is not None:
            self._receive_replica(step, store, world=world)
        for work in pending:
            if work is not None:
                work.wait()

    def _receive_replica(self, step: int, store: MemoryStore, *, world: int) -> None:
        src = self._global(self.receive_from)  # type: ignore[arg-type]
        sizes = torch.empty(2, dtype=torch.int64)
        dist.recv(sizes, src, group=self.group)
        head_len, data_len = (int(v) for v in sizes)
        if self._inbox.numel() < head_len + data_len:
            self._inbox = torch.empty(head_len + data_len, dtype=torch.uint8)
        dist.recv(self._inbox[:head_len], src, group=self.group)
        if data_len:
            dist.recv(self._inbox[head_len : head_len + data_len], src, group=self.group)
        blob = self._inbox[: head_len + data_len].numpy()
        rank = self.receive_from
        assert rank is not None
        store.begin(step, replica=True)
        path = store.part_path(step, rank, replica=True)
        stale = path[: -len(".part")] + ".json"
        if os.path.exists(stale):
            os.remove(stale)  # an earlier attempt's replica of this step: never let its marker vouch for this
        with open(path, "wb") as f:
            f.write(blob.data)
        fault_point("memory_replicate", step)  # the replica is written, not marked
        store.mark(step, rank, world, int(blob.size), checksum(blob.data), replica=True)

    # ---- at restore -------------------------------------------------------------------------------------------
    def send_part(self, store: MemoryStore, step: int, rank: int, *, world: int, dst: int) -> None:
        """Send the replica of ``rank``'s part of ``step`` to ``dst``; an unreadable one is sent as an error."""
        try:
            meta: dict[str, Any] = store.marker(step, rank, world, replica=True)
            blob = store.read(step, rank, replica=True)
        except (CheckpointCorrupt, OSError) as err:
            meta, blob = {"error": f"the peer's replica is unreadable: {err}"}, memoryview(b"")
        self._send_blob(json.dumps(meta).encode(), dst)
        self._send_blob(blob, dst)

    def receive_part(self, *, src: int) -> tuple[dict[str, Any], bytearray]:
        """The marker and bytes of a part a peer sends (see :meth:`send_part`).

        Raises:
            CheckpointCorrupt: the peer could not read its replica.
        """
        meta = json.loads(bytes(self._receive_blob(src)))
        blob = self._receive_blob(src)
        if "error" in meta:
            raise CheckpointCorrupt(meta["error"])
        return meta, blob

    def _send_blob(self, blob: bytes | memoryview, dst: int) -> None:
        peer = self._global(dst)
        dist.send(torch.tensor([len(blob)], dtype=torch.int64), peer, group=self.group)
        if len(blob):
            data = (
                torch.frombuffer(blob, dtype=torch.uint8)
                if isinstance(blob, memoryview)
                else _bytes_tensor(blob)
            )
            dist.send(data, peer, group=self.group)

    def _receive_blob(self, src: int) -> bytearray:
        peer = self._global(src)
        size = torch.empty(1, dtype=torch.int64)
        dist.recv(size, peer, group=self.group)
        blob = bytearray(int(size.item()))
        if blob:
            dist.recv(torch.frombuffer(blob, dtype=torch.uint8), peer, group=self.group)
        return blob
