"""Crash-loop detection: stop restarting a job whose attempts keep failing the same way.

Rank 0 of every attempt records, in ``<run_dir>/attempts/attempt-<n>.json``, the step it restored and the
furthest step it reached, with the id of the launch it belongs to; the record is written as soon as the attempt
starts, so an attempt that dies while restoring counts as one without progress. Every rank whose attempt ends on
an error records that error's one line and the step it failed in (``attempt-<n>.rank-<r>.failed.json``,
``record_failure``). Before an attempt does any work, ``check()`` looks at the previous ``limit`` attempts of
the same launch. The job is in a crash loop when each of them ended where it began (no step completed past its
restored step), or when each failed with the same error in the same step (progress made from the restored
checkpoint does not cure a bug that fires at that step every time: a restart cannot fix it). A peer's reaction
to a failure (gloo's "Connection closed by peer") is no error of its own, so only a rank's own error counts.
The detector writes the verdict to the launch folder's ``CRASH_LOOP`` (which ``goodput launch`` watches, to
stop torchrun; it stays there, in the run's history), or to ``<run_dir>/CRASH_LOOP`` without a launcher, and
raises CrashLoop.

A new launch starts a new window: its attempts carry a new launch id, and attempts of earlier launches, whatever
their verdict, do not count against it (the user fixed something and relaunched).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, NoReturn

from goodput.errors import CrashLoop
from goodput.job.folder import launch_dir, launch_id

__all__ = ["CRASH_LOOP_FILE", "CrashLoopDetector", "attempt_records", "record_failure"]

CRASH_LOOP_FILE = "CRASH_LOOP"
_FAILED = ".failed.json"  # attempt-<n>.rank-<r>.failed.json: the error that ended rank r's attempt n


class CrashLoopDetector:
    """Records this attempt's progress and refuses to start the next attempt of a crash loop.

    Args:
        run_dir: the run folder (local path).
        attempt: this attempt's number.
        limit: consecutive attempts without progress that make a crash loop.
        min_interval: seconds between progress writes after the first step past the restored one (which is
            written at once; the last step is always written on ``close``).
        launch: the launch this attempt belongs to (None: ``$GOODPUT_LAUNCH_ID``, else torchrun's run id).
    """

    def __init__(
        self,
        run_dir: str,
        attempt: int,
        *,
        limit: int = 3,
        min_interval: float = 1.0,
        launch: str | None = None,
    ) -> None:
        self.limit = limit
        self.attempt = attempt
        self.launch = launch if launch is not None else launch_id()
        self._dir = os.path.join(run_dir, "attempts")
        folder = launch_dir()
        self._marker = os.path.join(folder or run_dir, CRASH_LOOP_FILE)
        self._min_interval = min_interval
        # -1: not restored yet; an attempt that dies before restoring made no progress.
        self._record: dict[str, Any] = {
            "attempt": attempt,
            "restored_step": -1,
            "max_step": -1,
            "launch": self.launch,
        }
        self._written = 0.0
        os.makedirs(self._dir, exist_ok=True)
        self._write()

    def check(self) -> None:
        """Raise CrashLoop when each of the previous ``limit`` attempts made no progress, or when each of them
        (at least two) failed with the same error in the same step."""
        if self.attempt < self.limit:
            return
        previous = [self._read(n) for n in range(self.attempt - self.limit, self.attempt)]
        # An attempt of an earlier launch ends the window: this launch has not failed `limit` times yet.
        if any(r is not None and r.get("launch", "") != self.launch for r in previous):
            return
        # A missing record is an attempt that died before it could write one: no progress either.
        if all(r is None or r["max_step"] <= r["restored_step"] for r in previous):
            stuck = max((r["restored_step"] for r in previous if r is not None), default=-1)
            where = f"step {stuck}" if stuck >= 0 else "before restoring"
            self._stop(f"the last {self.limit} attempts made no progress past their restored step ({where})")
        window = max(self.limit, 2)  # one failure is no repetition
        if self.attempt < window:
            return
        failures = [self._failure(n) for n in range(self.attempt - window, self.attempt)]
        last = failures[-1]
        if last is not None and all(f is not None and _same(f, last) for f in failures):
            self._stop(
                f"the last {window} attempts failed with the same error in step {last['step']}: "
                f"rank {last['rank']}: {last['error']}"
            )

    def _stop(self, message: str) -> NoReturn:
        """Write the verdict where the launcher (or the user) finds it, and raise it."""
        os.makedirs(os.path.dirname(self._marker), exist_ok=True)
        with open(self._marker, "w") as f:
            f.write(message + "\n")
        raise CrashLoop(message)

    def start(self, restored_step: int | None) -> None:
        """Record the step this attempt restored (None: it started from scratch)."""
        step = restored_step or 0
        self._record.update(restored_step=step, max_step=step)
        self._write()

    def progress(self, step: int) -> None:
        """Note that ``step`` completed (written at most every ``min_interval`` seconds)."""
        first = self._record["max_step"] <= self._record["restored_step"]
        self._record["max_step"] = max(self._record["max_step"], step)
        # The first step past the restored one is what the verdict needs: write it at once; later ones lazily.
        if first or time.monotonic() - self._written >= self._min_interval:
            self._write()

    def close(self) -> None:
        """Write the final progress."""
        self._write()

    def _path(self, attempt: int) -> str:
        return os.path.join(self._dir, f"attempt-{attempt}.json")

    def _read(self, attempt: int) -> dict[str, Any] | None:
        try:
            with open(self._path(attempt)) as f:
                record: dict[str, Any] = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return record

    def _failure(self, attempt: int) -> dict[str, Any] | None:
        """The error that ended ``attempt`` in this launch: the lowest rank's own error (a peer's reaction to it
        is none); None when no rank recorded one."""
        prefix = f"attempt-{attempt}.rank-"
        try:
            names = [n for n in os.listdir(self._dir) if n.startswith(prefix) and n.endswith(_FAILED)]
        except FileNotFoundError:
            return None
        own = []
        for name in names:
            try:
                with open(os.path.join(self._dir, name)) as f:
                    record = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and not record.get("peer") and record.get("launch") == self.launch:
                own.append(record)
        return min(own, key=lambda r: int(r.get("rank", 0)), default=None)

    def _write(self) -> None:
        path = self._path(self.attempt)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self._record, f)
        os.replace(tmp, path)
        self._written = time.monotonic()


def _same(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two attempts failed the same way: the same error (its one line) in the same step."""
    return bool(one["step"] == other["step"] and one["error"] == other["error"])


def record_failure(run_dir: str, attempt: int, *, rank: int, step: int, error: str, peer: bool) -> None:
    """Record that ``rank``'s ``attempt`` ended on ``error`` (its one line) in ``step``; ``peer``: the error is a
    reaction to another rank's failure. The next attempt's ``check()`` compares it with the previous ones'."""
    folder = os.path.join(run_dir, "attempts")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"attempt-{attempt}.rank-{rank}{_FAILED}")
    record = {"rank": rank, "step": step, "error": error, "peer": peer, "launch": launch_id()}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def attempt_records(run_dir: str) -> list[str]:
    """The names of the attempt records in ``run_dir`` (``attempt-<n>.json``, one per attempt that started),
    leaving aside each rank's record of the error that ended an attempt."""
    try:
        names = os.listdir(os.path.join(run_dir, "attempts"))
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith("attempt-") and n.endswith(".json") and ".rank-" not in n)
