"""Hot spare cost: one more spare forked from the node's template against one spawned, idle and under load.

    goodput bench spares [--spares 3] [--json]

A spare's start is measured up to where it would wait for a rank: a probe script imports what
``bench/_restart_train.py`` imports (it imports that module) and writes its own CPU time and the wall clock.

* spawned: ``python -u -m goodput.warm.boot PROBE``, as the warm agent spawned a spare without a template; its
  CPU is the whole process's.
* forked: from a template started as the agent starts one (``goodput.warm.forked``); its CPU is the spare's own
  from the fork, plus the template's share: the template's CPU (and its reaped middle processes') over the
  forks it made, counted after its imports.

Each is measured with the cores idle and while two busy processes stand in for two training ranks (each
computes 45 ms and waits 5 ms, as a rank waits on its all-reduce), at the priorities the agent gives them
(``goodput.warm.idle``): wall from the request to the probe's report. Goals: forked CPU <= 0.2 s, forked
wall under load <= 1 s; ``ratios.spawned_cpu_over_forked_cpu`` compares the two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["add_arguments", "run"]

_PROBE = """import json, os, resource, time
import goodput.bench._restart_train  # its imports, as the spare of that script has them
usage = resource.getrusage(resource.RUSAGE_SELF)
with open(os.environ["PROBE_OUT"], "w") as f:
    json.dump({"cpu": usage.ru_utime + usage.ru_stime, "wall": time.time()}, f)
"""
_RANK = "import time\nwhile True:\n    end = time.monotonic() + 0.045\n    while time.monotonic() < end: pass\n    time.sleep(0.005)\n"
_TIMEOUT = 120.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spares", type=int, default=3, help="spares made each way and load (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


@contextmanager
def _ranks(busy: bool) -> Iterator[None]:
    """Two stand-in ranks keeping the cores busy while the block runs (none if not ``busy``)."""
    procs = [subprocess.Popen([sys.executable, "-c", _RANK]) for _ in range(2 if busy else 0)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _report(path: str, started: float) -> dict[str, float]:
    with open(path) as f:
        got = json.load(f)
    return {"cpu": got["cpu"], "wall": got["wall"] - started}


def _spawned(probe: str, folder: str, n: int) -> list[dict[str, float]]:
    from goodput.warm.idle import can_return, make_idle

    out = []
    for i in range(n):
        path = os.path.join(folder, f"spawned-{i}.json")
        started = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "goodput.warm.boot", probe], env={**os.environ, "PROBE_OUT": path}
        )
        if can_return():
            make_idle(proc.pid)
        proc.wait(timeout=_TIMEOUT)
        out.append(_report(path, started))
    return out


def _template_ticks(pid: int) -> int:
    """The template's CPU clock ticks, its reaped children's included (``/proc/PID/stat`` fields 14-17)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15])


def _forked(probe: str, folder: str, n: int, *, busy: bool) -> tuple[list[dict[str, float]], float]:
    """The forked spares' reports, and the template's CPU seconds per fork."""
    from goodput.launch.launcher import LaunchConfig
    from goodput.warm.forked import TemplateForks
    from goodput.warm.idle import can_return, make_normal

    events: list[str] = []
    forks = TemplateForks(LaunchConfig(script=(probe,)), lambda event, **f: events.append(f"{event} {f}"))
    forks.settled(lambda: dict(os.environ), can_return())
    if not forks.finish(_TIMEOUT):
        raise RuntimeError(f"the template did not start: {events}")
    out = []
    template = forks.pid()
    assert template is not None
    with _ranks(busy):
        before = _template_ticks(template)
        for i in range(n):
            path = os.path.join(folder, f"forked-{i}.json")
            started = time.time()
            spare = forks.fork(f"spare{i}", {**os.environ, "PROBE_OUT": path})
            if spare is None:
                raise RuntimeError(f"no spare forked: {events}")
            if can_return():
                make_normal(spare.pid)  # as the agent does
            spare.wait(_TIMEOUT)
            out.append(_report(path, started))
        share = (_template_ticks(template) - before) / os.sysconf("SC_CLK_TCK") / n
    forks.close()
    return out, share


def _median(rows: list[dict[str, float]], key: str) -> float:
    return round(statistics.median(row[key] for row in rows), 4)


def run(args: argparse.Namespace) -> int:
    from goodput.errors import ConfigError

    if args.spares < 1:
        raise ConfigError(f"--spares must be >= 1, got {args.spares}")
    result: dict[str, Any] = {"spares": args.spares}
    with tempfile.TemporaryDirectory() as folder:
        probe = os.path.join(folder, "probe.py")
        with open(probe, "w") as f:
            f.write(_PROBE)
        for load in ("idle", "busy"):
            with _ranks(load == "busy"):
                spawned = _spawned(probe, folder, args.spares)
            forked, share = _forked(probe, folder, args.spares, busy=load == "busy")
            result[load] = {
                "spawned_cpu_s": _median(spawned, "cpu"),
                "spawned_ready_s": _median(spawned, "wall"),
                "forked_cpu_s": round(_median(forked, "cpu") + share, 4),
                "template_share_cpu_s": round(share, 4),
                "forked_ready_s": _median(forked, "wall"),
            }
    idle = result["idle"]
    result["ratios"] = {"spawned_cpu_over_forked_cpu": round(idle["spawned_cpu_s"] / idle["forked_cpu_s"], 1)}
    if args.json:
        print(json.dumps(result))
    else:
        for load in ("idle", "busy"):
            print(f"{load}: " + ", ".join(f"{k} {v}" for k, v in result[load].items()))
        print(f"spawned CPU / forked CPU: {result['ratios']['spawned_cpu_over_forked_cpu']}")
    return 0
