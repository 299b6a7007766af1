"""The failure schedule of ``goodput bench peers``, and the killer that applies it to any contender.

The schedule is drawn once from a seed (exponential gaps with the given mean, a uniformly random rank each) and
applied from outside the job, the same way for every contender: at each time since the launch, the process that
holds that rank then gets SIGKILL. The holder is found from goodput's ledger, which every contender writes (the
baseline through a thin wrapper): the newest ledger file of the rank names its process. A failure due while the
rank has no live process (the job is restarting) is applied as soon as one is up again, so every contender
receives every failure of the schedule that falls before it finishes.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np

__all__ = ["Killer", "draw_schedule", "sweep"]


def draw_schedule(
    mtbf: float | None, *, seed: int, world_size: int, horizon: float
) -> list[tuple[float, int]]:
    """(seconds since the launch, rank) of each failure up to ``horizon``; none when ``mtbf`` is None."""
    if mtbf is None:
        return []
    rng = np.random.default_rng(seed)
    out: list[tuple[float, int]] = []
    t = float(rng.exponential(mtbf))
    while t < horizon:
        out.append((round(t, 3), int(rng.integers(world_size))))
        t += float(rng.exponential(mtbf))
    return out


def _holder(run_dir: str, rank: int) -> int | None:
    """The live process that holds ``rank`` now (from its newest ledger file), or None."""
    folder = Path(run_dir) / "ledger"
    try:
        files = sorted(folder.glob(f"attempt-*.rank-{rank:05d}.jsonl"))
    except OSError:
        return None
    if not files:
        return None
    try:
        with open(files[-1]) as f:
            first = json.loads(f.readline())
    except (OSError, ValueError):
        return None  # not flushed yet
    pid = int(first.get("pid", 0))
    return pid if pid and _alive(pid, run_dir) else None


def _alive(pid: int, run_dir: str) -> bool:
    """Whether ``pid`` runs (not a zombie) and belongs to this run (its environment names the run folder)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z" and f"GOODPUT_RUN_DIR={run_dir}".encode() in environ


def sweep(run_dir: str) -> list[int]:
    """SIGKILL what is left of a finished run: every live process whose environment names ``run_dir`` (a data
    loader worker forked by a rank its launcher killed may otherwise wait on its inherited sockets for good)."""
    run_dir = os.path.abspath(run_dir)
    left = [int(name) for name in os.listdir("/proc") if name.isdigit() and _alive(int(name), run_dir)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    return left


class Killer:
    """Applies ``schedule`` to the job writing its ledger under ``run_dir``, from ``start`` (monotonic)."""

    def __init__(self, run_dir: str, schedule: list[tuple[float, int]], start: float) -> None:
        self.run_dir, self.schedule, self.start = os.path.abspath(run_dir), schedule, start
        self.fired: list[dict[str, float | int]] = []  # due, fired (seconds since start), rank, pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="peers-killer", daemon=True)

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        sweep(self.run_dir)  # the run has ended (or failed): nothing of it may outlive it

    def _loop(self) -> None:
        killed: set[int] = set()
        for due, rank in self.schedule:
            if self._stop.wait(max(0.0, self.start + due - time.monotonic())):
                return
            while True:
                pid = _holder(self.run_dir, rank)
                if pid is not None and pid not in killed:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    killed.add(pid)
                    fired = time.monotonic() - self.start
                    self.fired.append({"due": due, "fired": round(fired, 3), "rank": rank, "pid": pid})
                    break
                if self._stop.wait(0.05):
                    return
