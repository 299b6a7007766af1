"""Crash-loop detection over attempt records written by real detector instances."""

from __future__ import annotations

import os

import pytest

from goodput.errors import CrashLoop
from goodput.run.crashloop import CRASH_LOOP_FILE, CrashLoopDetector


def _attempt(run_dir: str, n: int, restored: int | None, reached: int | None) -> CrashLoopDetector:
    det = CrashLoopDetector(run_dir, n, limit=3)
    det.check()
    det.start(restored)
    if reached is not None:
        det.progress(reached)
    det.close()
    return det


def test_three_attempts_without_progress_stop_the_fourth(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    _attempt(run_dir, 0, None, 40)  # trains to 40, checkpoint at 40, crashes
    for n in (1, 2, 3):
        _attempt(run_dir, n, 40, None)  # each dies right after restoring step 40
    with pytest.raises(CrashLoop, match="last 3 attempts made no progress"):
        CrashLoopDetector(run_dir, 4, limit=3).check()
    with open(os.path.join(run_dir, CRASH_LOOP_FILE)) as f:
        assert "step 40" in f.read()


def test_progress_in_any_recent_attempt_is_not_a_loop(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    _attempt(run_dir, 0, None, 10)
    _attempt(run_dir, 1, 10, None)
    _attempt(run_dir, 2, 10, 15)  # got past its restored step before dying
    _attempt(run_dir, 3, 10, None)
    CrashLoopDetector(run_dir, 4, limit=3).check()
    assert not os.path.exists(os.path.join(run_dir, CRASH_LOOP_FILE))


def test_early_attempts_cannot_be_a_loop_yet(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    _attempt(run_dir, 0, None, None)
    _attempt(run_dir, 1, None, None)
    CrashLoopDetector(run_dir, 2, limit=3).check()


def test_attempts_that_die_while_restoring_are_a_loop(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    for n in range(3):
        CrashLoopDetector(run_dir, n, limit=3).check()  # each dies before start(): no restore recorded
    with pytest.raises(CrashLoop, match="before restoring"):
        CrashLoopDetector(run_dir, 3, limit=3).check()


def test_one_step_of_progress_is_recorded_even_if_killed_right_after(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    for n in range(3):
        det = CrashLoopDetector(run_dir, n, limit=3, min_interval=3600.0)
        det.check()
        det.start(10 * n)
        det.progress(10 * n + 1)  # then SIGKILL: no close()
    CrashLoopDetector(run_dir, 3, limit=3).check()
