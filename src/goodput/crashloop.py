"""Crash-loop detection: stop restarting a job whose attempts keep failing without progress.

Rank 0 of every attempt records, in ``<run_dir>/attempts/attempt-<n>.json``, the step it restored and the
furthest step it reached. At the start of an attempt, if each of the previous ``limit`` attempts ended where
it began (no step completed past its restored step), the job is in a crash loop: the detector writes the
verdict to ``<run_dir>/CRASH_LOOP`` (which ``goodput launch`` watches, to stop torchrun) and raises CrashLoop.
"""

from __future__ import annotations

import json
import os
import time

from goodput.errors import CrashLoop

__all__ = ["CrashLoopDetector"]

CRASH_LOOP_FILE = "CRASH_LOOP"


class CrashLoopDetector:
    """Records this attempt's progress and refuses to start the next attempt of a crash loop.

    Args:
        run_dir: the run folder (local path).
        attempt: this attempt's number.
        limit: consecutive attempts without progress that make a crash loop.
        min_interval: seconds between progress writes (the last step is always written on ``close``).
    """

    def __init__(self, run_dir: str, attempt: int, *, limit: int = 3, min_interval: float = 1.0) -> None:
        self.limit = limit
        self.attempt = attempt
        self._dir = os.path.join(run_dir, "attempts")
        self._marker = os.path.join(run_dir, CRASH_LOOP_FILE)
        self._min_interval = min_interval
        self._record = {"attempt": attempt, "restored_step": 0, "max_step": 0}
        self._written = 0.0

    def start(self, restored_step: int | None) -> None:
        """Record the restored step; raise CrashLoop when the previous attempts made no progress."""
        os.makedirs(self._dir, exist_ok=True)
        step = restored_step or 0
        self._record.update(restored_step=step, max_step=step)
        self._write()
        previous = [self._read(n) for n in range(self.attempt - self.limit, self.attempt)]
        if self.attempt >= self.limit and all(
            r is not None and r["max_step"] <= r["restored_step"] for r in previous
        ):
            message = (
                f"the last {self.limit} attempts made no progress past their restored step "
                f"(step {step}); fix the failure, then relaunch (see the workers' logs)"
            )
            with open(self._marker, "w") as f:
                f.write(message + "\n")
            raise CrashLoop(message)

    def progress(self, step: int) -> None:
        """Note that ``step`` completed (written at most every ``min_interval`` seconds)."""
        self._record["max_step"] = max(self._record["max_step"], step)
        now = time.monotonic()
        if now - self._written >= self._min_interval:
            self._write()

    def close(self) -> None:
        """Write the final progress."""
        self._write()

    def _path(self, attempt: int) -> str:
        return os.path.join(self._dir, f"attempt-{attempt}.json")

    def _read(self, attempt: int) -> dict[str, int] | None:
        try:
            with open(self._path(attempt)) as f:
                record: dict[str, int] = json.load(f)
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
