"""The warm-restart RNG records: the newest intact slot wins, a torn write falls back to the previous step."""

from __future__ import annotations

import os

from goodput.run._warm_record import RecordFiles, record_folder, remove_folder


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


def test_one_job_one_folder() -> None:
    a = record_folder("127.0.0.1:1234", "")
    assert a == record_folder("127.0.0.1:1234", "")
    assert a != record_folder("127.0.0.1:1235", "") != record_folder("127.0.0.1:1234", "goodput-warm/x/")


def _holds(path: str, text: bytes) -> bool:
    with open(path, "rb") as f:
        return text in f.read()
