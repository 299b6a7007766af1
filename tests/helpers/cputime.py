"""Where the suite's time goes: each test's wall time beside the CPU time it and its processes used.

Set ``GOODPUT_TEST_CPU`` to a file and every test appends one JSON line to it: its id, wall seconds (setup, call
and teardown) and CPU seconds: the test worker's own, and that of every process below it, running or ended
(read from /proc: a process's own time and that of the children it waited for). The forkserver that
``goodput.testing.run_ranks`` keeps for the session is below the worker, so ranks started through it count. A
test whose CPU is far below its wall waits (on a timeout, a rendezvous, a sleep in the script it runs); one whose
CPU is about its wall works. Processes that outlive their parent and are adopted by init are lost to the sum.
Off when the variable is unset; nothing the suite asserts depends on it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator

import pytest

FILE = os.environ.get("GOODPUT_TEST_CPU", "")
_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, CPU ticks of the process and of its waited-for children), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), sum(int(x) for x in fields[11:15])  # ppid; utime, stime, cutime, cstime


def _below_seconds(root: int) -> float:
    """CPU seconds of every live process below ``root`` (itself excluded), children's waited-for time included."""
    rows = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(p)) is not None}
    below, frontier = 0, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, ticks) in rows.items():
            if ppid == parent:
                below += ticks
                frontier.append(pid)
    return below / _TICK


def _cpu() -> tuple[float, float]:
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system + _below_seconds(os.getpid())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    if not FILE:
        yield
        return
    (own0, below0), t0 = _cpu(), time.monotonic()
    yield
    (own1, below1), wall = _cpu(), time.monotonic() - t0
    row = {"test": item.nodeid, "wall": round(wall, 3)}
    row |= {"self_cpu": round(max(own1 - own0, 0.0), 3), "children_cpu": round(max(below1 - below0, 0.0), 3)}
    with open(FILE, "a") as f:  # one short line per write: lines from two test workers do not interleave
        f.write(json.dumps(row) + "\n")
