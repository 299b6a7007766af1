"""goodput._ports.free_port: ports below the kernel's ephemeral range, free with every asked-for twin."""

from __future__ import annotations

import socket

from goodput._ports import _ephemeral_start, free_port


def test_a_free_port_lies_below_the_ephemeral_range_and_binds() -> None:
    start = _ephemeral_start()
    for _ in range(20):
        port = free_port()
        assert port < start, f"{port} is inside the kernel's ephemeral range (from {start})"
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_block_of_ports_is_free_as_a_whole() -> None:
    port = free_port(also=range(1, 8))
    for p in range(port, port + 8):
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
