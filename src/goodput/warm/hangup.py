"""Hang up a generation's gloo connections when it ends, so that no survivor waits out the collective timeout.

gloo cannot abort a collective (its ``ProcessGroup.abort`` and ``shutdown`` do nothing), and a rank blocked in
one fails only when a connection it reads from breaks. When a rank dies, only its neighbours in the collective's
ring lose a connection; the others wait on survivors that have already left the collective but whose
connections stay open for as long as anything holds them: the failed step's objects, a forked DataLoader
worker's copy of the descriptor. So each survivor hangs up: it shuts down (``shutdown(SHUT_RDWR)``, which acts
on the connection itself, whoever else holds a descriptor of it) the connections of its generation's gloo
groups, and a peer reading from one fails at once with "Connection closed by peer", a peer failure.

Which connections: those accepted by a listening socket this process opened since the generation began. Each
gloo group listens on a socket of its own as it forms (the job's group, goodput's, the script's), and each
connection between two ranks is accepted by one of them, so when every survivor hangs up, every connection
between survivors breaks. Connections this process opened itself (the store client, HTTP) and listeners it
had before the generation began are left alone. Sockets are found through ``/proc/self/fd`` and
``/proc/self/net/tcp{,6}``; without them (not Linux) nothing is found and the ranks wait as before.
"""

from __future__ import annotations

import os
import socket

__all__ = ["Hangup"]

_LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp


class Hangup:
    """The listening sockets this process had as a generation began; calling it hangs up the generation."""

    def __init__(self) -> None:
        table = _tcp_table()
        self._before = frozenset(ino for ino in _socket_fds() if ino in table and table[ino][2] == _LISTEN)

    def __call__(self) -> int:
        """Shut down every connection accepted by a listening socket opened since the generation began (each
        peer's read from it fails at once); the number shut down. Safe from any thread, and to repeat."""
        fds, table = _socket_fds(), _tcp_table()
        listening = [
            table[ino][:2]
            for ino in fds
            if ino in table and table[ino][2] == _LISTEN and ino not in self._before
        ]
        done = 0
        for ino, fd in fds.items():
            address, port, state = table.get(ino, ("", -1, _LISTEN))
            if state != _LISTEN and any(_accepted_by(address, port, lis) for lis in listening):
                done += _shut_down(fd, ino)
        return done


def _accepted_by(address: str, port: int, listener: tuple[str, int]) -> bool:
    # a listener on every address (0.0.0.0, ::) accepts on each of them
    return port == listener[1] and (address == listener[0] or set(listener[0]) == {"0"})


def _socket_fds() -> dict[int, int]:
    """This process's sockets: inode -> a descriptor of it."""
    found: dict[int, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile (another thread)
            continue
        if link.startswith("socket:["):
            found[int(link[8:-1])] = int(name)
    return found


def _tcp_table() -> dict[int, tuple[str, int, str]]:
    """The TCP sockets of this process's network namespace: inode -> (local address in hex, port, state)."""
    table: dict[int, tuple[str, int, str]] = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/self/net/{name}") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, port = fields[1].split(":")
            table[int(fields[9])] = (address, int(port, 16), fields[3])
    return table


def _shut_down(fd: int, inode: int) -> int:
    """Shut down the socket ``inode`` through a duplicate of ``fd`` (1), unless ``fd`` is no longer it (0)."""
    try:
        dup = os.dup(fd)
    except OSError:  # closed meanwhile
        return 0
    try:
        if os.fstat(dup).st_ino != inode:  # the descriptor's number was reused meanwhile
            return 0
        conn = socket.socket(fileno=dup)
        dup = -1  # conn owns it now
        with conn:
            conn.shutdown(socket.SHUT_RDWR)
        return 1
    except OSError:  # already shut down or reset by the peer
        return 0
    finally:
        if dup >= 0:
            os.close(dup)
