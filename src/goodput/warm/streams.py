"""What a rank's random generators hold after a shrink or a grow: the state a cold resume on the new world would
give it, so a resized run can be reproduced from a checkpoint and verified bitwise.

A cold resume restores a checkpoint's per-rank entries by number (``goodput.checkpoint.state``): new rank r takes
old rank r's RNG states when the saving world had rank r, else it is seeded by ``rank_seed(seed, r, step)``. A
resized generation that recovers step s gives rank r the same: old rank r's RNG record of step s
(``goodput.warm.record``), or the new-rank seed. A shrink renumbers the survivors in their old order, so new
rank r is mostly another process than old rank r, which may be dead; its record is in the RAM folder of the
node it ran on. So the first rank of each node offers the records its node's folder holds, in one gather over
the new group, and every rank takes its own number's. A record no node holds any more (its node was lost
whole) leaves the rank seeded as a new one: the one case where the streams differ from a cold resume's.

The offers travel as plain bytes (``<qqI``: old rank, step, length; then the record), never pickled.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

from goodput.warm.protocol import Generation
from goodput.warm.record import RecordFiles

__all__ = ["chosen", "exchange", "offered", "pack", "resized_record", "unpack"]

_ENTRY = struct.Struct("<qqI")  # old rank, step, length

Offer = Mapping[int, tuple[int, bytes]]  # old rank -> (the record's step, the record)


def resized_record(info: Generation, rank: int, folder: str, step: int, group: Any) -> bytes | None:
    """New ``rank``'s RNG record after the shrink or grow ``info`` (the generation's info) describes: old rank
    ``rank``'s record of ``step``; None for a rank the old world did not have, or whose record no node holds (it
    is seeded as a new rank). A collective over ``group``: every rank of the generation calls it.

    Args:
        info: the generation's info (``world_before``, ``world_size``, ``nodes``: each node's new ranks).
        rank: this process's new rank.
        folder: this node's record folder (``goodput.warm.record.record_folder``).
        step: the step the group recovered.
        group: a gloo group of the generation (None: the default group).
    """
    before, world, nodes = info.world_before, info.world_size, info.nodes
    assert before is not None and world is not None and nodes is not None  # a resized generation's
    local = next(held for held in nodes.values() if rank in held)
    wanted = range(min(before, world)) if rank == min(local) else range(0)  # one offer per node
    offers = exchange(offered(folder, wanted, step), world, group)
    return chosen(offers, rank, step) if rank < before else None


def offered(folder: str, ranks: Iterable[int], step: int) -> dict[int, tuple[int, bytes]]:
    """The records this node's ``folder`` holds of ``ranks`` (the old numbering): each one's record of ``step``
    when intact, else its newest (as a warm restart reads it)."""
    out: dict[int, tuple[int, bytes]] = {}
    for rank in ranks:
        found = RecordFiles(folder, rank).read(step)
        if found is not None:
            out[rank] = found
    return out


def chosen(offers: Iterable[Offer], rank: int, step: int) -> bytes | None:
    """Old rank ``rank``'s record among every node's ``offers``: the one of ``step``, else the newest; None when
    no node holds one."""
    found = [offer[rank] for offer in offers if rank in offer]
    exact = [data for at, data in found if at == step]
    if exact:
        return exact[0]
    return max(found, key=lambda entry: entry[0])[1] if found else None


def pack(offer: Offer) -> bytes:
    """``offer`` as bytes for the gather."""
    return b"".join(_ENTRY.pack(rank, at, len(data)) + data for rank, (at, data) in sorted(offer.items()))


def unpack(raw: bytes) -> dict[int, tuple[int, bytes]]:
    """The offer :func:`pack` made."""
    out: dict[int, tuple[int, bytes]] = {}
    at = 0
    while at < len(raw):
        rank, step, size = _ENTRY.unpack_from(raw, at)
        at += _ENTRY.size
        out[rank] = (step, raw[at : at + size])
        at += size
    return out


def exchange(offer: Offer, world_size: int, group: Any) -> list[dict[int, tuple[int, bytes]]]:
    """Every rank's offer (a collective over ``group``: every rank of the generation calls it)."""
    import torch
    import torch.distributed as dist

    raw = pack(offer)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([len(raw)], dtype=torch.int64), group=group)
    longest = max(1, *(int(size.item()) for size in sizes))  # gloo is given no empty tensor
    mine = torch.zeros(longest, dtype=torch.uint8)
    if raw:
        mine[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    every = [torch.empty(longest, dtype=torch.uint8) for _ in range(world_size)]
    dist.all_gather(every, mine, group=group)
    return [unpack(t[: int(n.item())].numpy().tobytes()) for t, n in zip(every, sizes, strict=True)]
