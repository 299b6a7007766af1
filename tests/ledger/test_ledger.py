"""The ledger writer and reader: real files, real child processes, real SIGKILL, real gloo ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from goodput import ConfigError, Ledger, LedgerConfig, account, read_events
from goodput.ledger import ledger_files

_CHILD = """
import sys
from goodput.ledger import Ledger, LedgerConfig
ledger = Ledger(sys.argv[1], rank=0, config=LedgerConfig(flush_seconds=0.5, fsync=False))
pad = "x" * 200_000  # big lines: the flusher spends its time inside write(), where SIGKILL can tear a line
step = 0
print("ready", flush=True)
while True:
    step += 1
    ledger.step_start(step)
    sum(range(20_000))  # the step's work
    ledger.step_end(step, fetch_seconds=0.0)
    ledger.event("blob", step=step, pad=pad)
"""


def _wait_for(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_round_trip_and_attempt_numbering(tmp_path: Path) -> None:
    for attempt in range(2):
        with Ledger(tmp_path, rank=0) as ledger:
            assert ledger.attempt == attempt
            ledger.init_done()
            ledger.restore_start()
            ledger.restore_end(step=None if attempt == 0 else 2)
            for step in range(1, 4):
                ledger.step_start(step)
                ledger.step_end(step, fetch_seconds=0.001, loss=1.0 / step)
            ledger.on_event("checkpoint_stall_start", step=3)
            ledger.on_event("checkpoint_stall_end", step=3, seconds=0.0)
            ledger.on_event("checkpoint_durable", step=3, seconds=0.0)
            ledger.event("eval", accuracy=0.5)
    files = ledger_files(tmp_path)
    assert [(f.attempt, f.rank) for f in files] == [(0, 0), (1, 0)]
    events = read_events(tmp_path)
    names = [e["event"] for e in events if e["attempt"] == 1]
    assert names[0] == "attempt_start" and names[-1] == "attempt_end"
    assert "eval" in names and names.count("step_end") == 3
    ends = [e for e in events if e["event"] == "step_end" and e["attempt"] == 1]
    assert [(e["step"], e["fetch_seconds"], e["loss"], e["rank"]) for e in ends] == [
        (1, 0.001, 1.0, 0),
        (2, 0.001, 0.5, 0),
        (3, 0.001, 1.0 / 3, 0),
    ]
    head = events[0]
    assert head["process_start"] <= head["wall"] and head["pid"] == os.getpid()
    acc = account(events)
    assert [a.outcome for a in acc.attempts] == ["ok", "ok"]
    assert sum(acc.categories.values()) == pytest.approx(acc.wall_seconds)


def test_failed_block_records_failed_status(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), Ledger(tmp_path) as ledger:
        ledger.step_start(1)
        raise RuntimeError("boom")
    assert read_events(tmp_path)[-1]["status"] == "failed"


def test_bad_fields_and_config_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="flush_seconds"):
        LedgerConfig(flush_seconds=0)
    with pytest.raises(ConfigError, match="local run folder"):
        Ledger("s3://bucket/run")
    with Ledger(tmp_path) as ledger:
        with pytest.raises(ConfigError, match="reserved"):
            ledger.event("eval", wall=3.0)
        with pytest.raises(ConfigError, match="JSON"):
            ledger.event("eval", value=object())
        with pytest.raises(ConfigError, match="fetch_seconds"):
            ledger.step_end(1, fetch_seconds=float("nan"))
        ledger.step_end(2, loss=float("inf"))  # a diverged loss is left out, the step still counts
    assert "loss" not in read_events(tmp_path)[-2]


def test_missing_ledger_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has no ledger"):
        read_events(tmp_path / "nowhere")


def test_exit_without_close_still_ends_the_attempt(tmp_path: Path) -> None:
    """atexit closes the ledger: "exited" on an exit without close() (its status unknown), failed on an
    uncaught exception."""
    for code, status in (("pass", "exited"), ("raise SystemExit('bye')", "exited"), ("1/0", "failed")):
        script = (
            f"import sys\nfrom goodput import Ledger\nled = Ledger(sys.argv[1])\nled.step_start(1)\n{code}\n"
        )
        folder = tmp_path / status / str(len(code))
        subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, check=False)
        last = read_events(folder)[-1]
        assert (last["event"], last["status"]) == ("attempt_end", status), code


def test_sigkill_mid_write_loses_at_most_about_a_second(tmp_path: Path) -> None:
    """A child appends big events non-stop; SIGKILL at an arbitrary moment. The file still reads, a torn
    last line (if the kill cut a write) is ignored with a warning, and the last event kept is recent."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)], stdout=subprocess.PIPE, cwd=os.getcwd(), text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        path = tmp_path / "ledger" / "attempt-0000.rank-00000.jsonl"
        _wait_for(lambda: path.exists() and path.stat().st_size > 5_000_000, "several flushes")
        killed_at = time.time()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    torn = not path.read_bytes().endswith(b"\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        events = read_events(tmp_path)
    messages = [str(w.message) for w in caught]
    assert ("torn last line" in " ".join(messages)) == torn
    assert len(messages) == int(torn)
    steps = [e["step"] for e in events if e["event"] == "step_end"]
    assert steps == list(range(1, len(steps) + 1))  # nothing lost in the middle
    assert killed_at - max(e["wall"] for e in events) < 1.5  # flush period 0.5 s, on a noisy machine
    acc = account(events)
    assert acc.attempts[0].outcome == "running"
    assert sum(acc.categories.values()) == pytest.approx(acc.wall_seconds)


def test_torn_line_in_a_real_file_is_ignored_with_a_warning(tmp_path: Path) -> None:
    with Ledger(tmp_path, rank=0) as ledger:
        for step in range(1, 6):
            ledger.step_start(step)
            ledger.step_end(step)
    path = ledger_files(tmp_path)[0].path
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 20])  # cut inside the attempt_end line, as a killed write would
    with pytest.warns(UserWarning, match="torn last line"):
        events = read_events(tmp_path)
    assert [e["event"] for e in events][-1] == "step_end"  # the steps come from their own file
    assert len(events) == data.count(b"\n") - 1 + 2 * 5


def test_appending_to_an_existing_attempt_ends_a_torn_line_first(tmp_path: Path) -> None:
    with Ledger(tmp_path, rank=0, attempt=3) as ledger:
        ledger.step_start(1)
    path = ledger_files(tmp_path)[0].path
    path.write_bytes(path.read_bytes()[:-5])
    with Ledger(tmp_path, rank=0, attempt=3) as ledger:
        ledger.step_start(1)
    with pytest.warns(UserWarning, match="unreadable line"):
        events = read_events(tmp_path)
    assert [e["event"] for e in events].count("attempt_start") == 2
    assert all(json.dumps(e) for e in events)


_RANK_CHILD = """
import sys
from goodput.ledger import Ledger, LedgerConfig
with Ledger(sys.argv[1], config=LedgerConfig(flush_seconds=0.01)) as ledger:
    for step in range(1, 401):
        ledger.step_start(step)
        ledger.step_end(step, fetch_seconds=0.0)
        ledger.event("padding", text="y" * 5000)
"""


def test_ranks_write_their_own_files_without_corruption(tmp_path: Path) -> None:
    """Two rank processes (RANK/WORLD_SIZE as torchrun sets them) write at the same time."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK_CHILD, str(tmp_path)],
            env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2"},
        )
        for rank in (0, 1)
    ]
    assert [child.wait(timeout=60) for child in children] == [0, 0]
    assert [(f.attempt, f.rank) for f in ledger_files(tmp_path)] == [(0, 0), (0, 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any unreadable line fails the test
        every = read_events(tmp_path, rank=None)
    for rank in (0, 1):
        steps = [e["step"] for e in every if e["rank"] == rank and e["event"] == "step_end"]
        assert steps == list(range(1, 401))
    assert read_events(tmp_path, rank=1)[0]["world_size"] == 2


def test_cache_stats_records_each_epochs_share_of_cumulative_counters(tmp_path: Path) -> None:
    with Ledger(tmp_path) as ledger:
        ledger.cache_stats(0, {"hits": 0, "misses": 100, "evictions": 3}, budget_bytes=10, dataset_bytes=50)
        ledger.cache_stats(1, {"hits": 10, "misses": 190})
    stats = [e for e in read_events(tmp_path) if e["event"] == "cache_stats"]
    assert [(e["epoch"], e["hits"], e["misses"]) for e in stats] == [(0, 0.0, 100.0), (1, 10.0, 90.0)]
    assert stats[0]["budget_bytes"] == 10 and stats[1]["budget_bytes"] is None


def test_a_forked_child_writes_nothing_to_the_parents_ledger(tmp_path: Path) -> None:
    with Ledger(tmp_path) as ledger:
        ledger.step_start(1)
        pid = os.fork()
        if pid == 0:  # the child: as a fork-started DataLoader worker would
            ledger.event("from_child")
            ledger.close()
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        ledger.step_end(1)
    names = [e["event"] for e in read_events(tmp_path)]
    assert names == ["attempt_start", "step_start", "step_end", "attempt_end"]
