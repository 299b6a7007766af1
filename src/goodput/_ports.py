"""Free TCP ports on 127.0.0.1 that the kernel will not hand to anyone else meanwhile.

A port taken with ``bind(("127.0.0.1", 0))`` and released comes from the kernel's ephemeral range, the range
every outgoing connection and every other ``bind(0)`` listener (gloo's full mesh, a DataLoader's) draws from
too: between the release and the moment a TCPStore or a rendezvous binds it again, any of those can take it
(EADDRINUSE). These ports are drawn at random from below the ephemeral range instead, which the kernel never
assigns on its own, so only a process that names the same port can collide.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable

__all__ = ["free_port"]

_LOWEST = 10000  # well above the registered services most machines run
_EPHEMERAL_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def _ephemeral_start() -> int:
    try:
        with open(_EPHEMERAL_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default where the file cannot be read


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, also: Iterable[int] = ()) -> int:
    """A port on 127.0.0.1 free now, and with each ``port + offset`` for ``offset`` in ``also`` free too
    (a block of ports, or a server's derived ports); all of them below the kernel's ephemeral range when it
    leaves room for them, else (a machine whose ephemeral range starts low) from the kernel itself."""
    offsets = sorted(set(also))
    top = _ephemeral_start() - 1 - max(offsets, default=0)
    rng = random.SystemRandom()
    for _ in range(500):
        if top > _LOWEST + 1000:
            port = rng.randint(_LOWEST, top)
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
        if port + max(offsets, default=0) >= 65536:
            continue
        if (top > _LOWEST + 1000 and not _is_free(port)) or not all(_is_free(port + o) for o in offsets):
            continue
        return port
    raise RuntimeError(f"no free port on 127.0.0.1 with {len(offsets)} more at offsets {offsets[:4]}")
