"""The attempts' indexes (goodput.ledger.index): the report read through them is the report read from every
rank's files, whole or not (a rank SIGKILLed before it closed, a torn line, an attempt opened twice, a ledger
written before the index)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from goodput.ledger import Ledger, LedgerConfig
from goodput.ledger.files import read_ledger
from goodput.ledger.index import index_path, read_index
from goodput.ledger.report import load_report
from tests.helpers.ledgers import record_steps

_KILLED = """
import sys
from goodput.ledger import Ledger, LedgerConfig
config = LedgerConfig(flush_seconds=0.05, fsync=False)
ledger = Ledger(sys.argv[1], rank=2, attempt=1, config=config, began=float(sys.argv[2]))
ledger.event("eval", step=3, score=0.25)
step = 0
while True:
    step += 1
    ledger.step_start(step)
    ledger.step_end(step, fetch_seconds=0.001, loss=1.0)
    if step == 20:
        ledger.flush()  # its attempt_start and eval are in the index, and steps 1-20 in its files
        print("flushed", flush=True)
"""


def _attempt(
    run: Path, attempt: int, ranks: tuple[int, ...], *, fail: bool, began: float | None = None
) -> None:
    """Every rank of ``ranks`` closes ``attempt`` after 30 steps, an eval seen by each and a rank's cache
    figures; ``fail``: rank 1 declares the failure. The ranks run one after the other in this process, each
    beginning when the attempt does."""
    began = time.time() if began is None else began
    for rank in ranks:
        config = LedgerConfig(fsync=False)
        with Ledger(run, rank=rank, attempt=attempt, config=config, began=began) as ledger:
            ledger.restore_start()
            ledger.restore_end(10 * attempt or None)
            ledger.init_done()
            record_steps(ledger, range(10 * attempt + 1, 10 * attempt + 31), loss=2.0)
            ledger.event("eval", step=10 * attempt + 30, score=0.5)
            ledger.cache_stats(attempt, {"hits": 3.0 + rank, "misses": 1.0})
            if fail and rank == 1:
                ledger.failure_detected("rank 1 watchdog", silent_seconds=0.5)


def _kill_rank_2(run: Path, began: float) -> None:
    """Rank 2's attempt 1 in its own process, SIGKILLed mid-run: it never writes its index's end line."""
    argv = [sys.executable, "-c", _KILLED, str(run), repr(began)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "flushed"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def _without_index(run: Path) -> Path:
    """The same ledger as one written before the index: every file but the indexes."""
    old = run.parent / f"{run.name}-without-index"
    shutil.copytree(run, old, ignore=shutil.ignore_patterns("*.index"))
    assert not list((old / "ledger").glob("*.index"))
    return old


def _same(run: Path, old: Path) -> None:
    assert read_ledger(run, primary=0)[0] == read_ledger(old, primary=0)[0]
    assert load_report(run).to_dict() | {"run_dir": ""} == load_report(old).to_dict() | {"run_dir": ""}


def test_the_index_reports_what_every_ranks_files_report_with_a_rank_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOODPUT_LAUNCH_ID", "one-launch")  # restarts within one launch, as goodput launch's
    run = tmp_path / "run"
    _attempt(run, 0, (0, 1, 2), fail=True)
    began = time.time()
    _kill_rank_2(run, began)
    _attempt(run, 1, (0, 1), fail=True, began=began)
    _attempt(run, 2, (0, 1, 2), fail=False)
    folder = run / "ledger"
    # whole entries are read from the index; the killed rank (no end line) is not
    assert set(read_index(index_path(folder, 0), {1, 2})) == {1, 2}
    assert set(read_index(index_path(folder, 1), {1, 2})) == {1}
    killed = (folder / "attempt-0001.index").read_bytes()
    assert b'"rank": 2' in killed and b'"index_end":2' not in killed
    _same(run, _without_index(run))
    report = load_report(run)
    assert report.accounting.restarts == 2
    assert [a.failure_reason for a in report.accounting.attempts] == ["rank 1 watchdog"] * 2 + [None]


def test_a_torn_index_line_reads_the_attempts_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _attempt(run, 0, (0, 1, 2), fail=True)
    _attempt(run, 1, (0, 1, 2), fail=False)
    index = index_path(run / "ledger", 0)
    whole = index.read_bytes()
    with open(index, "ab") as f:  # a write cut short, then another rank's line appended after it
        f.write(b'{"event": "eval", "wall": 1.0, "mono"' + whole[: whole.index(b"\n") + 1])
    assert read_index(index, {1, 2}) == {}
    _same(run, _without_index(run))


def test_a_line_another_append_overwrote_reads_that_ranks_files(tmp_path: Path) -> None:
    """Two appends at one offset (NFS emulates O_APPEND) can leave one rank's job line replaced whole by
    another's, with no torn line: the end line's count names the rank that lost a line."""
    run = tmp_path / "run"
    _attempt(run, 0, (0, 1, 2), fail=True)
    index = index_path(run / "ledger", 0)
    lines = index.read_bytes().splitlines(keepends=True)
    lost = next(
        n for n, line in enumerate(lines) if b'"rank": 1' in line and b'"event": "failure_detected"' in line
    )
    other = next(line for line in lines if b'"rank": 2' in line and b'"event": "eval"' in line)
    index.write_bytes(b"".join([*lines[:lost], other, *lines[lost + 1 :]]))
    assert set(read_index(index, {1, 2})) == set()  # rank 1 lost a line, rank 2 holds one too many
    _same(run, _without_index(run))
    assert load_report(run).accounting.attempts[0].failure_reason == "rank 1 watchdog"


def test_an_attempt_opened_twice_by_a_rank_reads_that_ranks_files(tmp_path: Path) -> None:
    """A second process of rank 1 appends to attempt 0 (an explicit attempt number): its two entries in the
    index are not one whole entry, and its JSONL holds both lifetimes."""
    run = tmp_path / "run"
    _attempt(run, 0, (0, 1), fail=False)
    with Ledger(run, rank=1, attempt=0, config=LedgerConfig(fsync=False)) as ledger:
        ledger.event("eval", step=99, score=0.75)
        ledger.failure_detected("again")
    assert read_index(index_path(run / "ledger", 0), {1}) == {}
    _same(run, _without_index(run))


def test_the_index_is_written_per_attempt_and_event_not_per_step(tmp_path: Path) -> None:
    with Ledger(tmp_path, rank=1, attempt=0, config=LedgerConfig(fsync=False)) as ledger:
        ledger.flush()
        index = index_path(tmp_path / "ledger", 0)
        first = index.read_bytes()
        for step in range(1, 1001):
            ledger.step_start(step)
            ledger.step_end(step)
        ledger.flush()
        assert index.read_bytes() == first  # the attempt_start line, and nothing per step
        ledger.event("eval", step=1000)
    lines = [json.loads(line) for line in index.read_bytes().splitlines()]
    assert [line.get("event") for line in lines] == ["attempt_start", "eval", None]
    assert lines[2]["index_end"] == 1 and lines[2]["last"]["event"] == "step_end"
    assert lines[2]["last"]["step"] == 1000
