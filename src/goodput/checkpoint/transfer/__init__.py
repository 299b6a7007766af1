"""Moving a training state between processes: one codec (checksummed, no pickle) and one transport.

``codec`` turns a state (state dicts, RNG states, data positions, small metadata) into a part and a message
and back, building nothing but tensors, containers and scalars; ``transport`` sends, receives and broadcasts
messages over a process group. The warm hand-over broadcasts a survivor's live state with them; the memory
tier writes parts to tmpfs and sends them to its peer node's replica.
"""

from goodput.checkpoint.transfer.codec import Message, decode, encode, open_message
from goodput.checkpoint.transfer.transport import Inbox, broadcast, broadcast_state, receive, send

__all__ = [
    "Inbox",
    "Message",
    "broadcast",
    "broadcast_state",
    "decode",
    "encode",
    "open_message",
    "receive",
    "send",
]
