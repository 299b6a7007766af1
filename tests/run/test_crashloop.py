"""Crash-loop detection over attempt records written by real detector instances (and ``record_failure``)."""

from __future__ import annotations

import os

import pytest

from goodput.errors import CrashLoop
from goodput.job.crashloop import CRASH_LOOP_FILE, CrashLoopDetector, record_failure


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


def _failed(run_dir: str, n: int, *, step: int, error: str, rank: int = 0, peer: bool = False) -> None:
    """Attempt ``n`` restores step 10, completes step 11 and fails in ``step`` on ``rank`` with ``error``."""
    _attempt(run_dir, n, 10 if n else None, 11)
    record_failure(run_dir, n, rank=rank, step=step, error=error, peer=peer)


def test_the_same_error_in_the_same_step_is_a_loop_despite_progress(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    for n in range(3):
        _failed(run_dir, n, step=12, error="ValueError: bad batch at step 12", rank=1)
        # rank 0 reacts to rank 1's exit: a peer's failure, no error of its own
        record_failure(
            run_dir, n, rank=0, step=13, error="RuntimeError: Connection closed by peer", peer=True
        )
    with pytest.raises(CrashLoop) as caught:
        CrashLoopDetector(run_dir, 3, limit=3).check()
    verdict = (
        "the last 3 attempts failed with the same error in step 12: rank 1: ValueError: bad batch at step 12"
    )
    assert str(caught.value) == verdict
    with open(os.path.join(run_dir, CRASH_LOOP_FILE)) as f:
        assert f.read().strip() == verdict


@pytest.mark.parametrize(
    "errors",
    [
        [
            (12, "ValueError: bad batch"),
            (13, "ValueError: bad batch"),
            (12, "ValueError: bad batch"),
        ],  # a step
        [(12, "ValueError: bad batch"), (12, "ValueError: bad batch"), (12, "ValueError: other batch")],
    ],
)
def test_an_error_that_changes_is_no_loop(tmp_path: os.PathLike[str], errors: list[tuple[int, str]]) -> None:
    run_dir = str(tmp_path)
    for n, (step, error) in enumerate(errors):
        _failed(run_dir, n, step=step, error=error)
    CrashLoopDetector(run_dir, 3, limit=3).check()
    assert not os.path.exists(os.path.join(run_dir, CRASH_LOOP_FILE))


def test_an_attempt_without_an_error_of_its_own_breaks_the_repetition(tmp_path: os.PathLike[str]) -> None:
    """A killed rank (no error) or only a peer's reaction: the same step three times is no proof of a bug."""
    run_dir = str(tmp_path)
    _failed(run_dir, 0, step=12, error="ValueError: bad batch")
    _attempt(run_dir, 1, 10, 11)  # SIGKILLed in step 12: nothing recorded
    _failed(run_dir, 2, step=12, error="ValueError: bad batch")
    _failed(run_dir, 3, step=12, error="RuntimeError: Connection closed by peer", peer=True)
    for n in (3, 4):
        CrashLoopDetector(run_dir, n, limit=3).check()


def test_one_failure_is_no_repetition_even_with_a_limit_of_one(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    _failed(run_dir, 0, step=12, error="ValueError: bad batch")
    CrashLoopDetector(run_dir, 1, limit=1).check()
    _failed(run_dir, 1, step=12, error="ValueError: bad batch")
    with pytest.raises(CrashLoop, match="the last 2 attempts failed with the same error in step 12"):
        CrashLoopDetector(run_dir, 2, limit=1).check()


def test_failures_of_an_earlier_launch_do_not_count(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = str(tmp_path)
    monkeypatch.setenv("GOODPUT_LAUNCH_ID", "first")
    for n in range(2):
        _failed(run_dir, n, step=12, error="ValueError: bad batch")
    monkeypatch.setenv("GOODPUT_LAUNCH_ID", "second")  # the user changed something and relaunched
    for n in range(2, 4):
        _failed(run_dir, n, step=12, error="ValueError: bad batch")
        CrashLoopDetector(run_dir, n + 1, limit=3).check()
    _failed(run_dir, 4, step=12, error="ValueError: bad batch")
    with pytest.raises(CrashLoop, match="same error in step 12"):
        CrashLoopDetector(run_dir, 5, limit=3).check()
