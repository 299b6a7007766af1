"""A userspace HTTP/1.1 proxy on 127.0.0.1 that injects network faults in front of a real server (the S3 server).

``tc netem`` is not available on this machine, so latency, bandwidth caps, 5xx bursts, stalls and dropped
connections are injected here, per request. Every request is logged (method, path, range, status, start and end
times, connection) so that tests can prove what went over the wire, e.g. that no object was downloaded twice at
once. Run it in-process (``FaultProxy(...).start()``) or as a process for benchmarks::

    python -m goodput.testing.faultproxy --upstream 127.0.0.1:8333 --latency 0.02 --bandwidth 20MB

which prints its port on the first line of stdout and serves until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

__all__ = ["FaultProxy", "RequestRecord"]

_BODYLESS = {204, 304}
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a TCP reset
_REASONS = {500: "Internal Server Error", 503: "Slow Down", 403: "Forbidden", 404: "Not Found"}
_REASONS[507] = "Insufficient Storage"
_Match = str | Callable[[str, str], bool] | None


@dataclass(frozen=True)
class RequestRecord:
    """One request that passed through (or was answered by) the proxy."""

    method: str
    path: str
    range: str | None
    status: int
    start: float
    end: float
    connection: int
    fault: str | None


@dataclass
class _Fault:
    kind: str  # "fail", "drop" or "stall"
    remaining: int
    status: int = 503
    code: str = "SlowDown"
    seconds: float = 0.0
    match: Callable[[str, str], bool] | None = None


class _Link:
    """A shared link: every connection's bytes queue for one rate (a token bucket with no burst)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._next = 0.0

    def wait_for(self, n: int) -> float:
        """Seconds to wait before ``n`` more bytes may go out."""
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + n / self.rate
            return start - now


@dataclass
class _Settings:
    latency_s: float = 0.0
    bandwidth_bps: float | None = None
    link: _Link | None = None
    faults: list[_Fault] = field(default_factory=list)


class FaultProxy:
    """Forwards HTTP/1.1 from ``127.0.0.1:port`` to ``upstream`` and injects faults per request.

    Args:
        upstream_port: the real server's port on 127.0.0.1.
        latency_s: delay before each request is forwarded (time to first byte).
        bandwidth_bps: bytes per second each connection may receive (None: no cap).
        link_bps: bytes per second all connections together may receive (None: no cap).
    """

    def __init__(
        self,
        upstream_port: int,
        *,
        latency_s: float = 0.0,
        bandwidth_bps: float | None = None,
        link_bps: float | None = None,
    ) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        link = _Link(link_bps) if link_bps else None
        self._settings = _Settings(latency_s=latency_s, bandwidth_bps=bandwidth_bps, link=link)
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._busy = 0  # requests read and not yet recorded
        self._log: list[RequestRecord] = []
        self._injected: dict[str, int] = {}
        self._server: socket.socket | None = None
        self._conn_ids = itertools.count()
        self._open: set[socket.socket] = set()
        self.port = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(128)
        self.port = int(server.getsockname()[1])
        self._server = server
        threading.Thread(target=self._accept, args=(server,), name="faultproxy", daemon=True).start()
        return self

    def stop(self, drain_s: float = 2.0) -> None:
        """Stop listening, let requests being answered be recorded (a client can hold its whole response
        before the handler records it), then cut every connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        with self._lock:
            self._settled.wait_for(lambda: self._busy == 0, timeout=drain_s)
            for sock in list(self._open):
                _close(sock)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- fault controls ----------------------------------------------------------------------------
    def set(self, *, latency_s: float | None = None, bandwidth_bps: float | None = None) -> None:
        """Change the latency and/or bandwidth cap for requests from now on."""
        with self._lock:
            if latency_s is not None:
                self._settings.latency_s = latency_s
            if bandwidth_bps is not None:
                self._settings.bandwidth_bps = bandwidth_bps or None

    def fail_next(self, n: int, *, status: int = 503, code: str = "SlowDown", match: _Match = None) -> None:
        """Answer the next ``n`` requests (whose path contains ``match``; a callable: for which
        ``match(method, path)`` is true) with an S3-style error."""
        self._add(_Fault("fail", n, status=status, code=code, match=_matcher(match)))

    def drop_next(self, n: int, *, match: str | None = None) -> None:
        """Reset the connection in the middle of the next ``n`` responses (whose path contains ``match``)."""
        self._add(_Fault("drop", n, match=_matcher(match)))

    def stall_next(self, n: int, seconds: float, *, match: str | None = None) -> None:
        """Hold the next ``n`` requests for ``seconds`` before forwarding them (client timeouts fire)."""
        self._add(_Fault("stall", n, seconds=seconds, match=_matcher(match)))

    def clear_faults(self) -> None:
        with self._lock:
            self._settings.faults.clear()

    def records(self) -> list[RequestRecord]:
        """A copy of the request log."""
        with self._lock:
            return list(self._log)

    def injected(self) -> dict[str, int]:
        """How many faults of each kind ("fail", "drop", "stall") were injected so far."""
        with self._lock:
            return dict(self._injected)

    def _add(self, fault: _Fault) -> None:
        with self._lock:
            self._settings.faults.append(fault)

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._settings.faults:
                if fault.remaining > 0 and (fault.match is None or fault.match(method, path)):
                    fault.remaining -= 1
                    self._injected[fault.kind] = self._injected.get(fault.kind, 0) + 1
                    return fault
        return None

    # ---- serving -----------------------------------------------------------------------------------
    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            conn_id = next(self._conn_ids)
            threading.Thread(target=self._serve, args=(client, conn_id), daemon=True).start()

    def _serve(self, client: socket.socket, conn_id: int) -> None:
        upstream: socket.socket | None = None
        with self._lock:
            self._open.add(client)
        reader = client.makefile("rb")
        try:
            while True:
                request = _read_message_head(reader)
                if request is None:
                    return
                with self._lock:
                    self._busy += 1
                try:
                    upstream = self._one_request(client, reader, request, upstream, conn_id)
                finally:
                    with self._lock:
                        self._busy -= 1
                        self._settled.notify_all()
                if upstream is None:
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self._open.discard(client)
            _close(client)
            if upstream is not None:
                _close(upstream)

    def _one_request(
        self,
        client: socket.socket,
        reader: BinaryIO,
        head: bytes,
        upstream: socket.socket | None,
        conn_id: int,
    ) -> socket.socket | None:
        """Handle one request; returns the upstream socket to reuse, or None to close the client."""
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        headers = _headers(lines[1:])
        start = time.time()
        if "100-continue" in headers.get("expect", "").lower():
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            head = _drop_header(head, b"expect")
        body = _read_body(reader, headers)
        fault = self._take_fault(method, path)
        with self._lock:
            latency, bandwidth, link = (
                self._settings.latency_s,
                self._settings.bandwidth_bps,
                self._settings.link,
            )
        if fault is not None and fault.kind == "stall":
            time.sleep(fault.seconds)  # the injected stall itself
        if latency:
            time.sleep(latency)  # the injected per-request latency itself
        if fault is not None and fault.kind == "fail":
            client.sendall(_error_response(method, fault.status, fault.code))
            self._record(method, path, headers, fault.status, start, conn_id, "fail")
            return upstream if upstream is not None else _connect(self.upstream)
        try:
            if upstream is None:
                upstream = _connect(self.upstream)
            upstream.sendall(head + body)
            up_reader = upstream.makefile("rb")
            dropped = fault is not None and fault.kind == "drop"  # a stall is a delay only
            status, keep = _relay_response(up_reader, client, method, bandwidth, link, drop=dropped)
        except OSError:  # the client gave up (e.g. timed out during a stall) or the server went away
            self._record(method, path, headers, 0, start, conn_id, fault.kind if fault else "broken")
            raise
        self._record(method, path, headers, status, start, conn_id, fault.kind if fault else None)
        if dropped:  # reset mid-response
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            _close(upstream)
            return None
        if not keep:
            _close(upstream)
            return None
        return upstream

    def _record(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        status: int,
        start: float,
        conn: int,
        fault: str | None,
    ) -> None:
        record = RequestRecord(method, path, headers.get("range"), status, start, time.time(), conn, fault)
        with self._lock:
            self._log.append(record)


def _matcher(match: str | Callable[[str, str], bool] | None) -> Callable[[str, str], bool] | None:
    if match is None or callable(match):
        return match
    return lambda method, path: match in path


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


def _read_message_head(reader: BinaryIO) -> bytes | None:
    lines: list[bytes] = []
    while True:
        line = reader.readline(65537)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            if not lines:
                continue
            return b"".join(lines) + b"\r\n"
        lines.append(line)


def _headers(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        if ":" in line:
            name, _, value = line.partition(":")
            out[name.strip().lower()] = value.strip()
    return out


def _drop_header(head: bytes, name: bytes) -> bytes:
    kept = [line for line in head.split(b"\r\n") if not line.lower().startswith(name + b":")]
    return b"\r\n".join(kept)


def _read_body(reader: BinaryIO, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _read_chunked(reader)
    length = int(headers.get("content-length", "0") or 0)
    return reader.read(length) if length else b""


def _read_chunked(reader: BinaryIO) -> bytes:
    parts = []
    while True:
        size_line = reader.readline()
        parts.append(size_line)
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers up to the blank line
                line = reader.readline()
                parts.append(line)
                if line in (b"\r\n", b"\n", b""):
                    return b"".join(parts)
        parts.append(reader.read(size + 2))


def _relay_response(
    up: BinaryIO,
    client: socket.socket,
    method: str,
    bandwidth: float | None,
    link: _Link | None,
    *,
    drop: bool,
) -> tuple[int, bool]:
    """Copy one response to the client; returns (status, whether the upstream connection stays usable)."""
    head = _read_message_head(up)
    if head is None:
        raise ConnectionResetError("upstream closed")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = _headers(lines[1:])
    keep = headers.get("connection", "").lower() != "close"
    if method == "HEAD" or status in _BODYLESS or 100 <= status < 200:
        body = b""
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        body = _read_chunked(up)
    elif "content-length" in headers:
        body = up.read(int(headers["content-length"]))
    else:
        body, keep = up.read(), False
    if drop:
        client.sendall(head + body[: len(body) // 2])
        return status, False
    _send_paced(client, head + body, bandwidth, link)
    return status, keep


def _send_paced(sock: socket.socket, data: bytes, bandwidth: float | None, link: _Link | None) -> None:
    if not bandwidth and link is None:
        sock.sendall(data)
        return
    step = 64 << 10
    started = time.monotonic()
    for offset in range(0, len(data), step):
        chunk = data[offset : offset + step]
        wait = link.wait_for(len(chunk)) if link is not None else 0.0
        if bandwidth:
            wait = max(wait, offset / bandwidth - (time.monotonic() - started))
        if wait > 0:
            time.sleep(wait)  # the injected bandwidth cap itself
        sock.sendall(chunk)


def _error_response(method: str, status: int, code: str) -> bytes:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>injected by goodput's fault proxy</Message><RequestId>faultproxy</RequestId></Error>"
    ).encode()
    reason = _REASONS.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
        "x-amz-request-id: faultproxy\r\n\r\n"
    ).encode()
    return head if method == "HEAD" else head + body


def main(argv: list[str] | None = None) -> int:
    """Serve as a process until killed; prints the port first."""
    from goodput.units import parse_bytes

    parser = argparse.ArgumentParser(prog="python -m goodput.testing.faultproxy")
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the real server (127.0.0.1 only)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added before each request")
    parser.add_argument("--bandwidth", default=None, help="per-connection cap, e.g. 20MB (per second)")
    parser.add_argument("--link-bandwidth", default=None, help="cap on all connections together, e.g. 64MB")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        parser.error("the proxy only forwards to 127.0.0.1")
    bandwidth = parse_bytes(args.bandwidth, what="--bandwidth") if args.bandwidth else None
    link = parse_bytes(args.link_bandwidth, what="--link-bandwidth") if args.link_bandwidth else None
    proxy = FaultProxy(int(port), latency_s=args.latency, bandwidth_bps=bandwidth, link_bps=link).start()
    print(proxy.port, flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
