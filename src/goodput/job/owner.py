"""Who owns a warm job's RAM folder, and the sweep of folders whose owners are provably gone.

A SIGKILLed ``goodput launch --restart warm`` takes its agent with it before either can remove the job's RNG
record folder in ``/dev/shm`` (:mod:`goodput.warm.record`), and RAM folders outlive their processes
until the machine reboots. The agent therefore writes an owner record into the folder it claims: its pid, the
pid's start time (``/proc/<pid>/stat`` field 22, so that a pid reused by another process is not taken for the
owner) and its pid namespace (a pid means nothing in another one). The next warm start on the node removes a
folder only when every owner record in it names a process of this namespace that no longer runs; a folder
without a readable record (not goodput's, or written where ``/proc`` is missing) or with a live owner stays.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil

__all__ = ["record_owner", "sweep_stale"]

_OWNER = "owner-"


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (None: no such process, a process that has
    ended and waits to be reaped, or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        # The command name (field 2) may hold spaces and parentheses: count fields after its closing one.
        fields = stat[stat.rindex(")") + 2 :].split()
        # A zombie has ended: an orphan re-parented to a subreaper that never reaps it stays one.
        return None if fields[0] in ("Z", "X") else fields[19]
    except (OSError, ValueError, IndexError):
        return None


def _namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def record_owner(folder: str) -> None:
    """Record this process as an owner of ``folder`` (nothing where ``/proc`` cannot identify it: such a folder
    is never swept)."""
    pid, start, namespace = os.getpid(), _start_time(os.getpid()), _namespace()
    if start is None or namespace is None:
        return
    record = json.dumps({"pid": pid, "start": start, "pidns": namespace})
    path = os.path.join(folder, f"{_OWNER}{pid}")
    with open(f"{path}.tmp", "w") as f:
        f.write(record)
    os.replace(f"{path}.tmp", path)  # a reader sees a whole record or none


def _owners_gone(folder: str) -> bool:
    """Whether ``folder`` holds owner records and every one names a process that provably ended."""
    namespace = _namespace()
    names = [n for n in os.listdir(folder) if n.startswith(_OWNER) and not n.endswith(".tmp")]
    if not names or namespace is None:
        return False
    for name in names:
        try:
            with open(os.path.join(folder, name)) as f:
                owner = json.load(f)
            pid, start, owner_namespace = int(owner["pid"]), str(owner["start"]), str(owner["pidns"])
        except (OSError, ValueError, TypeError, KeyError):
            return False  # not a record goodput wrote: nothing proves its owner gone
        if owner_namespace != namespace or _start_time(pid) == start:
            return False  # another namespace's process, or the owner still runs
    return True


def sweep_stale(base: str, prefix: str) -> list[str]:
    """Remove this user's folders named ``prefix*`` in ``base`` whose owners are provably gone.

    Returns:
        The folders removed.
    """
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            with contextlib.suppress(OSError):
                if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                    continue
                if entry.stat(follow_symlinks=False).st_uid != os.getuid() or not _owners_gone(entry.path):
                    continue
                shutil.rmtree(entry.path)
                removed.append(entry.path)
    return removed
