"""Backing a memory-tier part file with 2 MiB pages, so reading it back costs little more than a memcpy.

A tmpfs file (``/dev/shm``) is kept in the page cache in 4 KiB pages unless its mount says ``huge=``, and
``/dev/shm`` is usually mounted without it. Reading such a file costs a page-cache lookup, a reference and a
separate copy for each 4 KiB page, markedly more than a memcpy of the same bytes; from a file held in 2 MiB pages
the same read costs about a memcpy (the memory tier's whole restore: `goodput bench recovery`'s
``memory_restore_over_memcpy_floor`` in docs/BENCHMARKS.md).

Linux (6.1+) lets a process turn the pages of a mapped shmem file into huge pages with ``MADV_COLLAPSE``
whatever the mount says (it refuses only when huge pages are denied system-wide). :func:`prefer_huge_pages`
does that for a part file before the part is written into it: the file is extended to its size, one byte per
2 MiB is touched (a range with no page at all is not collapsed), and the range is collapsed, which allocates
zeroed huge pages. The write then fills them (and costs less than filling 4 KiB pages one by one). A part file
is reused by later saves (see ``MemoryStore.recycle``), so the collapse is paid once per file; on a file
already in huge pages it returns at once. Everything here is best effort: on another OS, an old kernel, a folder
that is not tmpfs (the kernel refuses; that file system is not asked again) or a failed call the file simply
stays in 4 KiB pages, and the part's bytes are the same either way.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import mmap
import os
import sys

__all__ = ["prefer_huge_pages"]

log = logging.getLogger(__name__)

_MADV_COLLAPSE = 25  # linux/mman.h (6.1+); not in Python's mmap module before 3.13
_MAP_FIXED = 0x10  # the same on every Linux architecture Python's mmap supports here
_PROT_NONE = 0
_HUGE = 2 << 20
_refused: set[int] = set()  # file systems (st_dev) where the kernel refused: not asked again


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def _collapse(fd: int, length: int) -> int:
    """Map ``length`` bytes of ``fd`` at a 2 MiB-aligned address and collapse them; returns 0 or an errno."""
    libc = _libc()
    failed = ctypes.c_void_p(-1).value
    # Reserve an address range with room to align, then map the file over its aligned part: a huge page can
    # only back an address and a file offset that agree modulo 2 MiB (file offset 0 here).
    reserved = libc.mmap(None, length + _HUGE, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if reserved in (None, failed):
        return ctypes.get_errno() or errno.ENOMEM
    try:
        aligned = (reserved + _HUGE - 1) // _HUGE * _HUGE
        mapped = libc.mmap(aligned, length, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
        if mapped in (None, failed):
            return ctypes.get_errno() or errno.ENOMEM
        if libc.madvise(mapped, length, _MADV_COLLAPSE) != 0:
            return ctypes.get_errno() or errno.EINVAL
        return 0
    finally:
        libc.munmap(reserved, length + _HUGE)


def prefer_huge_pages(fd: int, size: int) -> bool:
    """Extend the file ``fd`` (opened for reading and writing) to ``size`` bytes held in huge pages where Linux allows it.

    Only whole 2 MiB ranges are collapsed (the tail stays in 4 KiB pages). The file's bytes are unspecified
    afterwards (the caller writes all of them). Returns whether the collapse succeeded.
    """
    length = size // _HUGE * _HUGE
    if sys.platform != "linux" or length == 0:
        return False
    try:
        stat = os.fstat(fd)
        if stat.st_dev in _refused:
            return False
        old = stat.st_size
        if old < size:
            os.ftruncate(fd, size)
        for offset in range(old // _HUGE * _HUGE, length, _HUGE):
            os.pwrite(fd, b"\0", offset)  # a range without any page in it is not collapsed
        error = _collapse(fd, length)
    except (OSError, AttributeError) as err:  # AttributeError: a libc without these symbols
        log.debug("memory tier: no huge pages for a part file: %s", err)
        return False
    if error in (errno.EINVAL, errno.ENOSYS, errno.EPERM):  # not tmpfs, an old kernel, or huge pages denied
        _refused.add(stat.st_dev)
    if error:
        log.debug("memory tier: no huge pages for a part file: %s", os.strerror(error))
    return error == 0
