"""The warm-restart RNG records: the newest intact slot wins, a torn write falls back to the previous step."""

from __future__ import annotations

import os

from goodput.warm.record import RecordFiles, record_folder, remove_folder


def test_the_newest_record_survives_a_new_writer_and_a_torn_write(tmp_path: os.PathLike[str]) -> None:
    folder = os.path.join(str(tmp_path), "rec")
    first = RecordFiles(folder, rank=1)
    assert first.read() is None
    for step in (1, 2, 3):
        first.write(step, b"x" * step)
    first.close()
    # The replacement (a new process) reads what its predecessor wrote last, and goes on from it.
    second = RecordFiles(folder, rank=1)
    assert second.read() == (3, b"xxx")
    second.write(4, b"yyyy")
    assert RecordFiles(folder, rank=1).read() == (4, b"yyyy")
    assert RecordFiles(folder, rank=0).read() is None  # another rank's records are its own
    # A write torn in the middle (the slot of step 4 loses its tail): the other slot, step 3, is read.
    torn = next(p for p in (os.path.join(folder, n) for n in os.listdir(folder)) if _holds(p, b"y"))
    with open(torn, "r+b") as f:
        f.truncate(os.path.getsize(torn) - 1)
    assert RecordFiles(folder, rank=1).read() == (3, b"xxx")
    remove_folder(folder)
    assert not os.path.exists(folder)


def test_a_step_recorded_twice_keeps_the_step_before_it(tmp_path: os.PathLike[str]) -> None:
    """Step 5 is recorded before the optimizer step and again at step_done: both records of step 4's
    predecessor stay readable, and a reader asking for a step gets that step's record when there is one."""
    folder = os.path.join(str(tmp_path), "rec")
    rec = RecordFiles(folder, rank=0)
    rec.write(4, b"four")
    rec.write(5, b"five-before-optimizer")
    rec.write(5, b"five-at-step-done")
    assert rec.read() == (5, b"five-at-step-done")
    assert rec.read(4) == (4, b"four")  # the group adopted step 4: its record, not the newest
    assert rec.read(9) == (5, b"five-at-step-done")  # no record of that step: the newest
    rec.close()
    again = RecordFiles(folder, rank=0)  # a new process goes on from the files
    again.write(5, b"five-again")
    again.write(6, b"six")
    assert again.read(5) == (5, b"five-again") and again.read() == (6, b"six")
    assert again.read(4) == (6, b"six")  # step 4's slot now holds step 6: no record of 4, so the newest


def test_one_job_one_folder() -> None:
    a = record_folder("127.0.0.1:1234", "")
    assert a == record_folder("127.0.0.1:1234", "")
    assert a != record_folder("127.0.0.1:1235", "") != record_folder("127.0.0.1:1234", "goodput-warm/x/")


def _holds(path: str, text: bytes) -> bool:
    with open(path, "rb") as f:
        return text in f.read()
