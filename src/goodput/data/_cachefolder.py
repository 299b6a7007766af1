"""The cache folder's files: a download lock per file, a read-only map of one, and the cleanup of what dead
processes left.

A POSIX record lock excludes other processes and is released by the kernel when its holder dies; a forked
child does not inherit it (flock's would be shared with the child and outlive the parent's download). Threads
of one process are excluded by a lock per key.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import threading
import time
from collections.abc import Iterator

from goodput._client_random import OWN_RANDOM
from goodput.data._cacheindex import CacheIndex, owner_alive


@contextlib.contextmanager
def mapped_file(path: str) -> Iterator[bytes | mmap.mmap]:
    """The content of the local file ``path`` as a read-only map, valid inside the block (an empty file, which
    cannot be mapped, as ``b""``)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield b""
            return
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield mapped
    finally:
        mapped.close()


class FileLocks:
    """One exclusive lock per cache key, across the threads and processes of the node."""

    def __init__(self, folder: str) -> None:
        self._folder = folder
        self._thread_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, key: str) -> Iterator[None]:
        with self._guard:
            thread_lock = self._thread_locks.setdefault(key, threading.Lock())
        with thread_lock:
            path = os.path.join(self._folder, f"{key}.lock")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                _lock_exclusive(fd)
                yield
            finally:
                os.close(fd)


def clean_stale(folder: str, index: CacheIndex) -> None:
    """Drop rows of dead processes, temp files they left, and ready rows whose file is gone."""
    index.drop_dead_owners()
    for sub in ("tmp", "uncached"):  # <key>.<owner>.<suffix>: downloads in flight, private copies
        for name in os.listdir(os.path.join(folder, sub)):
            parts = name.split(".")
            owner = parts[1].replace("-", ":", 1) if len(parts) == 3 else ""
            if not owner or not owner_alive(owner):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, sub, name))
    files_dir = os.path.join(folder, "files")
    for key in index.ready_keys():
        if not os.path.exists(os.path.join(files_dir, key)):
            index.forget(key)
    known = index.ready_keys()
    for name in os.listdir(files_dir):
        # A file with no row was renamed by a process that died before recording it: not trusted.
        if name not in known and index.entry(name) is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(files_dir, name))


def _lock_exclusive(fd: int) -> None:
    """Take a POSIX record lock, retrying when the kernel reports a deadlock.

    The kernel tracks record locks per process, not per thread: when two processes each have one thread
    holding a file's lock and another waiting for the other's, it sees a cycle that the threads do not have
    and answers EDEADLK. Waiting a moment and asking again resolves it.
    """
    delay = 0.001
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            return
        except OSError as err:
            if err.errno != errno.EDEADLK:
                raise
        time.sleep(OWN_RANDOM.uniform(0, delay))  # back off: the other process's thread is about to finish
        delay = min(delay * 2, 0.05)
