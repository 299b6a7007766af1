"""Each rank's RNG record under warm restarts, kept in a node-local RAM file instead of the agent's store.

After every completed step a rank writes its RNG state so that, if it dies, its replacement (a spare on the
same node: spares are per node) continues its random streams exactly. Writing it to the agent's TCP store would
cost a round trip to another process per step, on every step; a ``pwrite`` to a file in ``/dev/shm`` needs no
other process to run.

Two slots per rank, written alternately, each ``step, length, crc32`` then the record's bytes (the binary RNG
record of :mod:`goodput.checkpoint.rng`): a write torn by a kill in the middle of the system call (the kernel may stop a write between pages on SIGKILL) fails its checksum, and
the reader takes the other slot (one step older: the documented case where a replacement's randomness may
differ). The folder is named after the launch (or the job's store address), so the workers and spares of one job
on one node share it and no two jobs do; the agent removes it at the end, and ``launch_warm`` again after the
launcher ended the job (it may have had to kill the agent). A launcher SIGKILLed itself runs neither, so the
agent claims the folder with an owner record (:mod:`goodput.job.owner`) and sweeps the folders whose
owners are provably gone when it starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import struct
import tempfile
import zlib

from goodput._env import LAUNCH_ID
from goodput.job.owner import record_owner, sweep_stale

__all__ = ["RecordFiles", "claim_folder", "record_folder", "remove_folder", "sweep_folders"]

_HEADER = struct.Struct("<qQI")  # step, length, crc32


def record_folder(store_address: str, prefix: str, launch: str | None = None) -> str:
    """This job's record folder on this node (``/dev/shm`` when it exists, else the temporary folder).

    Named after the launch (``launch``, else ``$GOODPUT_LAUNCH_ID``, which ``goodput launch`` gives its agent
    and every worker and spare of the node), so the launcher can remove it even after it had to kill the agent;
    without one, after the job's store.
    """
    launch = launch if launch is not None else LAUNCH_ID.get()
    key = f"launch|{launch}" if launch else f"{store_address}|{prefix}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return os.path.join(_base(), f"goodput-warm-{os.getuid()}-{digest}")


def _base() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def claim_folder(folder: str) -> None:
    """Create this job's record folder with this process (the agent) as its owner (``launch_warm`` swept the
    folders of earlier jobs before it started the agent)."""
    os.makedirs(folder, exist_ok=True)
    record_owner(folder)


def sweep_folders() -> None:
    """Remove the record folders of this user's earlier jobs whose owners are provably gone (a SIGKILLed
    launcher's), at a warm launch's start: before its agent, which may fail before it claims a folder."""
    sweep_stale(_base(), f"goodput-warm-{os.getuid()}-")


def remove_folder(folder: str) -> None:
    """Remove a job's record folder (the agent, at the job's end)."""
    shutil.rmtree(folder, ignore_errors=True)


class RecordFiles:
    """One rank's RNG records: ``write`` after each step, ``read`` by whoever holds the rank next."""

    def __init__(self, folder: str, rank: int) -> None:
        self.folder = folder
        self.rank = rank
        self._fds: list[int] = []
        self._next = 0
        self._last: int | None = None  # the step of the newest record written

    def _paths(self) -> list[str]:
        return [os.path.join(self.folder, f"rank-{self.rank}.{slot}") for slot in (0, 1)]

    def write(self, step: int, data: bytes) -> None:
        """Write ``data`` as ``step``'s record (one ``pwrite``).

        A newer step goes into the slot not holding the newest, so the previous step's record stays; the same
        step again (the record taken before the optimizer step, then the one at ``step_done``) replaces the
        newest in place, so the previous step's record still stays.
        """
        if not self._fds:
            os.makedirs(self.folder, exist_ok=True)
            self._fds = [os.open(path, os.O_RDWR | os.O_CREAT, 0o600) for path in self._paths()]
            newest = self._newest()
            self._next = 0 if newest is None else 1 - newest[0]
            self._last = None if newest is None else newest[1][0]
        slot = 1 - self._next if step == self._last else self._next
        os.pwritev(self._fds[slot], [_HEADER.pack(step, len(data), zlib.crc32(data)), data], 0)
        self._next = 1 - slot
        self._last = step

    def read(self, step: int | None = None) -> tuple[int, bytes] | None:
        """The intact record of ``step`` if there is one, else the newest: (its step, its bytes); None when none
        was written."""
        found = [r for r in (_read_slot(path) for path in self._paths()) if r is not None]
        exact = [r for r in found if r[0] == step]
        if exact:
            return exact[0]
        return max(found, key=lambda r: r[0]) if found else None

    def _newest(self) -> tuple[int, tuple[int, bytes]] | None:
        """(the slot, (step, bytes)) of the newest intact record."""
        best: tuple[int, int, bytes] | None = None
        for slot, path in enumerate(self._paths()):
            found = _read_slot(path)
            if found is not None and (best is None or found[0] > best[0]):
                best = (found[0], slot, found[1])
        return None if best is None else (best[1], (best[0], best[2]))

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []


def _read_slot(path: str) -> tuple[int, bytes] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if len(raw) < _HEADER.size:
        return None
    step, length, crc = _HEADER.unpack_from(raw)
    data = raw[_HEADER.size : _HEADER.size + length]
    if len(data) != length or zlib.crc32(data) != crc:
        return None  # torn by a kill mid-write
    return step, data
