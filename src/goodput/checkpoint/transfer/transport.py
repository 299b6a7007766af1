"""Moving a state's message (:mod:`goodput.checkpoint.transfer.codec`) between processes over a process group.

On the wire a message is its 24-byte envelope, then the part's header, then its tensor bytes (when there are
any): three tensors, so the tensor bytes go out of the sender's staging buffer and into the receiver's buffer
with no copy in between, and the receiver learns every length from the envelope before it posts a receive.
Ranks are the group's own; the receiver checks the whole message (:func:`~goodput.checkpoint.transfer.codec.
open_message`) before anyone reads it. Collectives use whatever group the caller passes: the warm hand-over its
generation's gloo group, the memory tier its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from goodput.checkpoint.transfer.codec import _ENVELOPE, Message, decode, encode

__all__ = ["Inbox", "Sending", "broadcast", "broadcast_state", "receive", "send"]


class Sending:
    """The sends of one message in flight: :meth:`wait` before the message's buffers are reused."""

    def __init__(self, works: list[Any]) -> None:
        self._works = works

    def wait(self) -> None:
        for work in self._works:
            if work is not None:
                work.wait()


class Inbox:
    """A receive buffer that grows to the largest message received and is reused by every later one."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def take(self, nbytes: int) -> torch.Tensor:
        if self.buffer.numel() < nbytes:
            self.buffer = torch.empty(nbytes, dtype=torch.uint8)
        return self.buffer[:nbytes]


def _global(group: Any, rank: int) -> int:
    return rank if group is None else int(dist.get_global_rank(group, rank))


def _pieces(message: Message) -> list[torch.Tensor]:
    """The tensors that carry ``message``: its envelope, then its header and its data where not empty."""
    pieces = [torch.frombuffer(bytearray(message.envelope), dtype=torch.uint8)]
    if len(message.head):
        pieces.append(torch.frombuffer(bytearray(message.head), dtype=torch.uint8))
    return [*pieces, message.data] if message.data.numel() else pieces


def _land(fill: Callable[[torch.Tensor], object], inbox: Inbox | None) -> memoryview:
    """The bytes of a message whose :func:`_pieces` ``fill`` writes one tensor at a time (a receive or a
    broadcast): the envelope first, whose lengths size the buffer (``inbox``'s, or a new one) the rest lands in."""
    envelope = torch.empty(_ENVELOPE.size, dtype=torch.uint8)
    fill(envelope)
    head_len, data_len, _ = _ENVELOPE.unpack(envelope.numpy().tobytes())
    start = envelope.numel()
    blob = (inbox or Inbox()).take(start + head_len + data_len)
    blob[:start].copy_(envelope)
    for view in (blob[start : start + head_len], blob[start + head_len :]):
        if view.numel():
            fill(view)
    return blob.numpy().data


def send(message: Message, dst: int, group: Any = None) -> Sending:
    """Start sending ``message`` to group rank ``dst``; returns the sends to wait for (no copy of the data)."""
    peer = _global(group, dst)
    return Sending([dist.isend(piece, peer, group=group) for piece in _pieces(message)])


def receive(src: int, group: Any = None, inbox: Inbox | None = None) -> memoryview:
    """The message group rank ``src`` sends (see :func:`send`), as bytes for ``decode``/``open_message``.

    ``inbox``: a buffer to reuse (the bytes are valid until its next receive).
    """
    peer = _global(group, src)
    return _land(lambda piece: dist.recv(piece, peer, group=group), inbox)


def broadcast(message: Message | None, src: int, group: Any = None) -> memoryview | Message:
    """Every rank's copy of the message group rank ``src`` holds: ``src`` passes it and gets it back, the
    others pass None and get its bytes (a collective over ``group``)."""
    root = _global(group, src)
    if message is not None:
        for piece in _pieces(message):
            dist.broadcast(piece, root, group=group)
        return message
    return _land(lambda piece: dist.broadcast(piece, root, group=group), None)


def broadcast_state(state: Mapping[str, Any] | None, src: int, group: Any = None) -> dict[str, Any]:
    """The state group rank ``src`` passes, on every rank of ``group``, its tensors new CPU tensors (a
    collective: the other ranks pass None).

    Raises:
        CheckpointCorrupt: the bytes changed on the way (every receiver checks them before it decodes).
        TypeError: on every rank, when ``src``'s state holds a value the codec cannot express (``src`` still
            broadcasts, saying so, so that no rank waits for a state that never comes).
    """
    message = None
    if state is not None:
        try:
            message = encode({"state": state})
        except TypeError as err:
            message = encode({"refused": str(err)})
    received = decode(broadcast(message, src, group))
    if "refused" in received:
        raise TypeError(f"the state of rank {src} cannot be sent: {received['refused']}")
    return dict(received["state"])
