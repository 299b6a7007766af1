"""Crash-loop detection: stop restarting a job whose attempts keep failing without progress.

Rank 0 of every attempt records, in ``<run_dir>/attempts/attempt-<n>.json``, the step it restored and the
furthest step it reached, with the id of the launch it belongs to; the record is written as soon as the attempt
starts, so an attempt that dies while restoring counts as one without progress. Before an attempt does any work,
``check()`` looks at the previous ``limit`` attempts of the same launch: if each ended where it began (no step
completed past its restored step), the job is in a crash loop, and the detector writes the verdict to the launch
folder's ``CRASH_LOOP`` (which ``goodput launch`` watches, to stop torchrun; it stays there, in the run's
history), or to ``<run_dir>/CRASH_LOOP`` without a launcher, and raises CrashLoop.

A new launch starts a new window: its attempts carry a new launch id, and attempts of earlier launches, whatever
their verdict, do not count against it (the user fixed something and relaunched).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from goodput.errors import CrashLoop
from goodput.launch.folder import launch_dir, launch_id

__all__ = ["CrashLoopDetector"]

CRASH_LOOP_FILE = "CRASH_LOOP"


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
        """Raise CrashLoop when each of the previous ``limit`` attempts made no progress."""
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
            message = f"the last {self.limit} attempts made no progress past their restored step ({where})"
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

    def _write(self) -> None:
        path = self._path(self.attempt)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self._record, f)
        os.replace(tmp, path)
        self._written = time.monotonic()
