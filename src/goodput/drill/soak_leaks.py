"""What the soak watches while the job runs: each process of the job (resident memory, open files, threads,
child processes) and the node (/dev/shm entries, the run folder's size, the temporary folder's entries, the
bytes in the data cache the job declared: :mod:`goodput.drill.soak_cache`), read from /proc and the disk by a
thread of the soak's own process, and the rule that calls a series a leak.

The rule (:func:`leaks`) is pure. A process is judged once it has lived four warm-ups (its start-up, a base,
and two whole warm-ups after the base: a shorter one would judge a few readings of a start-up or a recovery):
each figure leaks when it keeps growing: the lowest reading of each of its last two warm-ups above the highest of
the one before (a figure that rose once, a hot spare that took a rank, a pool started late, is no leak), and
resident memory only when it grew so by more than 5% over its second warm-up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import threading
from collections.abc import Callable, Sequence

from goodput.drill.runs import processes_of
from goodput.drill.soak_cache import CacheSample, LedgerCaches, held_bytes, over_budget

__all__ = ["RSS_GROWTH", "Sample", "Sampler", "leaks", "peaks"]

RSS_GROWTH = 0.05  # resident memory may grow this much after the warm-up
_METRICS = ("rss_mib", "fds", "threads", "children")
_RSS_NOISE_MIB = (
    1.0  # a rise of resident memory within this is no growth (a page table, a cache line of heap)
)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One reading of one process (``pid`` 0: the node, whose figures are in ``node``)."""

    seconds: float
    pid: int
    role: str
    rss_mib: float = 0.0
    fds: int = 0
    threads: int = 0
    children: int = 0


def _window(series: Sequence[Sample], start: float, end: float) -> list[Sample]:
    return [s for s in series if start <= s.seconds < end]


def leaks(series: Sequence[Sample], *, warmup: float, now: float) -> list[str]:
    """Why one process's readings (in time order) show a leak, as of ``now`` (empty: none, or too young)."""
    if not series:
        return []
    # A process that shows one thread is waiting (a forked hot spare before it takes a rank, an interpreter before
    # its first import): its warm-up counts from its first reading with more, or a start-up that spans two
    # warm-ups under load reads as two rises.
    first = next((s.seconds for s in series if s.threads != 1), series[0].seconds)
    if now - first < 4 * warmup:
        return []
    base = _window(series, first + warmup, first + 2 * warmup)
    # the warm-up before the recent one, after the base
    middle = _window(series, now - 2 * warmup, now - warmup)
    recent = _window(series, now - warmup, now + 1)
    if not base or not middle or not recent:
        return []
    who = f"pid {series[0].pid} ({series[0].role})"
    found = []
    for metric in _METRICS:
        b = max(getattr(s, metric) for s in base)
        low, high = min(getattr(s, metric) for s in middle), max(getattr(s, metric) for s in middle)
        r = min(getattr(s, metric) for s in recent)
        slack = _RSS_NOISE_MIB if metric == "rss_mib" else 0
        if not (low > b + slack and r > high + slack):
            continue  # flat, or one rise (a spare that took a rank, a pool started late): no leak
        if metric != "rss_mib":
            found.append(f"{who}: {metric} kept growing: {b} after its warm-up, {low}, then {r}")
        elif r > (1 + RSS_GROWTH) * b:
            found.append(
                f"{who}: resident memory kept growing, from {b:.0f} MiB after its warm-up to {r:.0f} MiB "
                f"(over {RSS_GROWTH:.0%})"
            )
    return found


def peaks(series: Sequence[Sample]) -> dict[str, float]:
    """The first and the highest reading of each figure: the table's cells."""
    out: dict[str, float] = {}
    for metric in _METRICS:
        values = [float(getattr(s, metric)) for s in series]
        out[f"{metric}_first"], out[f"{metric}_max"] = values[0], max(values)
    return out


def _read_process(pid: int) -> tuple[float, int, int] | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss = int(fields.get("VmRSS", "0 kB").split()[0]) / 1024
    return rss, fds, int(fields.get("Threads", "0"))


def _argv(pid: int | None) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _role(pid: int, script: str, parent: int | None) -> str:
    argv = _argv(pid)
    head = " ".join(argv[:4])
    if "goodput.warm" in head:  # the agent, and the ranks and spares forked from it (or from its template)
        return "worker" if "goodput.warm" in " ".join(_argv(parent)[:4]) else "agent"
    if "goodput launch" in head or ("-m goodput" in head and "launch" in argv[:5]):
        return "launcher"
    return (
        "worker"
        if any(os.path.basename(script) in a for a in argv)
        else os.path.basename(argv[0] if argv else "?")
    )


def _parents(pids: Sequence[int]) -> dict[int, int]:
    """pid -> its parent's pid, for each of ``pids`` still alive."""
    parents: dict[int, int] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                parents[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return parents


def _folder_mib(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total / 2**20


class Sampler(threading.Thread):
    """Reads the job's processes and the node every ``every`` seconds until :meth:`stop`; ``leaked`` holds the
    first leak found (:func:`leaks`) or the first reading of a data cache over its budget
    (:func:`~goodput.drill.soak_cache.over_budget`), for the soak to stop the job at once."""

    def __init__(
        self, run_dir: str, script: str, *, clock: Callable[[], float], warmup: float, every: float = 1.0
    ) -> None:  # fmt: skip
        super().__init__(name="goodput-soak-sampler", daemon=True)
        self.run_dir, self.script, self.clock, self.warmup, self.every = run_dir, script, clock, warmup, every
        self.series: dict[int, list[Sample]] = {}
        self.node: list[
            tuple[float, int, float, int]
        ] = []  # seconds, /dev/shm entries, run MiB, temp entries
        self.caches = LedgerCaches(run_dir)
        self.cache: list[CacheSample] = []  # every reading of each cache folder the job declared
        self.leaked = ""
        self._halt = threading.Event()

    def stop(self) -> None:
        """End the sampling (after one last reading in progress)."""
        self._halt.set()
        self.join()

    def save(self, path: str) -> None:
        """Every reading, one JSON line each (the node's with pid 0), for a closer look after the soak."""
        with open(path, "w") as f:
            for series in self.series.values():
                for sample in series:
                    f.write(json.dumps(dataclasses.asdict(sample)) + "\n")
            for seconds, shm, run_mib, temp in self.node:
                f.write(
                    json.dumps({"seconds": seconds, "pid": 0, "shm": shm, "run_mib": run_mib, "temp": temp})
                    + "\n"
                )
            for reading in self.cache:  # pid 0 too, with the folder, the bytes held and the budget
                f.write(json.dumps({"pid": 0, **dataclasses.asdict(reading)}) + "\n")

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.sample()

    def sample(self) -> None:
        """One reading of every process of the job and of the node; judges each process's series."""
        now = self.clock()
        pids = processes_of(self.run_dir)
        parents = _parents(pids)
        children = {p: sum(1 for q in parents.values() if q == p) for p in pids}
        for pid in pids:
            read = _read_process(pid)
            if read is None:
                continue
            series = self.series.setdefault(pid, [])
            role = series[0].role if series else _role(pid, self.script, parents.get(pid))
            series.append(Sample(now, pid, role, read[0], read[1], read[2], children.get(pid, 0)))
            found = leaks(series, warmup=self.warmup, now=now)
            if found and not self.leaked:
                self.leaked = "; ".join(found)
        shm = len(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else 0
        self.node.append((now, shm, _folder_mib(self.run_dir), len(os.listdir(tempfile.gettempdir()))))
        for folder, budget in self.caches.look().items():
            reading = CacheSample(now, folder, held_bytes(folder), budget)
            self.cache.append(reading)
            if (over := over_budget(reading)) and not self.leaked:
                self.leaked = over
