"""The ledger's step records (goodput.ledger.steps): written beside the JSONL, read back as the step events a
ledger of the older format holds in its JSON lines, with open, interrupted and torn records handled."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from goodput.ledger import Ledger, LedgerConfig, read_events
from goodput.ledger.files import read_ledger
from goodput.ledger.report import build_report, load_report
from goodput.ledger.steps import HEADER, RECORD, steps_path
from tests.helpers.ledgers import record_steps


def _old_format(run_dir: Path, events: list[dict[str, Any]]) -> Path:
    """The same events written as the ledger wrote them before step records: every event a JSON line."""
    old = run_dir.parent / f"{run_dir.name}-old"
    for event in events:
        path = old / "ledger" / f"attempt-{event['attempt']:04d}.rank-{event['rank']:05d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(event, separators=(",", ":")) + "\n")
    return old


def test_steps_go_to_their_own_file_and_read_back_as_events(tmp_path: Path) -> None:
    with Ledger(tmp_path, rank=0) as ledger:
        ledger.init_done()
        for step in (1, 2, 3):
            ledger.step_start(step)
            ledger.step_end(step, fetch_seconds=0.25 * step, loss=1.0 / step if step != 2 else None)
    jsonl = ledger.path.read_text()
    assert "step_" not in jsonl  # none of them in the JSON lines
    assert steps_path(ledger.path).stat().st_size == len(HEADER) + 3 * RECORD.size
    events = read_events(tmp_path)
    assert [e["event"] for e in events] == [
        "attempt_start", "init_done", *["step_start", "step_end"] * 3, "attempt_end"
    ]  # fmt: skip
    ends = [e for e in events if e["event"] == "step_end"]
    assert [(e["step"], e["fetch_seconds"], e.get("loss")) for e in ends] == [
        (1, 0.25, 1.0), (2, 0.5, None), (3, 0.75, 1 / 3)
    ]  # fmt: skip
    assert all(e["attempt"] == 0 and e["rank"] == 0 for e in ends)
    monos = [e["mono"] for e in events]
    assert monos == sorted(monos)


def test_an_open_step_is_kept_once_and_superseded_when_it_ends(tmp_path: Path) -> None:
    """A flush while a step runs writes it as open; its end supersedes that record. A step that a later one
    follows without ending (a shrink interrupted it) and one still open at the close stay open."""
    with Ledger(tmp_path, rank=0, config=LedgerConfig(flush_seconds=60)) as ledger:
        ledger.step_start(1)
        ledger.flush()
        ledger.flush()  # written once, however many flushes find it open
        ledger.step_end(1)
        ledger.step_start(2)
        ledger.step_start(3)
        ledger.step_end(3)
        ledger.step_start(4)
    size = steps_path(ledger.path).stat().st_size
    assert size == len(HEADER) + 5 * RECORD.size  # 1 open then ended, 2 open, 3 ended, 4 open
    names = [(e["event"], e["step"]) for e in read_events(tmp_path) if "step" in e]
    assert names == [
        ("step_start", 1), ("step_end", 1), ("step_start", 2), ("step_start", 3), ("step_end", 3),
        ("step_start", 4),
    ]  # fmt: skip


def test_a_torn_step_record_is_ignored_with_a_warning_and_appending_goes_on_after_it(tmp_path: Path) -> None:
    with Ledger(tmp_path, rank=0, attempt=2) as ledger:
        for step in (1, 2):
            ledger.step_start(step)
            ledger.step_end(step)
    path = steps_path(ledger.path)
    path.write_bytes(path.read_bytes()[:-10])  # a kill cut the last record's write
    with pytest.warns(UserWarning, match="torn last step record"):
        steps = [e["step"] for e in read_events(tmp_path) if e["event"] == "step_end"]
    assert steps == [1]
    with Ledger(tmp_path, rank=0, attempt=2) as ledger:  # the attempt opened again appends whole records
        ledger.step_start(5)
        ledger.step_end(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        steps = [e["step"] for e in read_events(tmp_path) if e["event"] == "step_end"]
    assert steps == [1, 5]


def test_other_ranks_give_only_their_last_step(tmp_path: Path) -> None:
    for rank in (0, 1):
        with Ledger(tmp_path, rank=rank, attempt=0) as ledger:
            for step in range(1, 101):
                ledger.step_start(step)
                ledger.step_end(step)
            ledger.step_start(101)  # open at the end: not a step_end
    events = read_events(tmp_path, rank=None, steps_of=0)
    other = [(e["event"], e["step"]) for e in events if e["rank"] == 1 and "step" in e]
    assert other == [("step_end", 100)]
    assert sum(1 for e in events if e["rank"] == 0 and e["event"] == "step_end") == 100


def test_a_ledger_of_the_older_format_reads_and_reports_the_same(tmp_path: Path) -> None:
    """Steps as JSON lines (no .steps file), as every ledger before step records: the same events, the same
    report."""
    with Ledger(tmp_path, rank=0, attempt=0) as ledger:
        ledger.restore_start()
        ledger.restore_end(None)
        ledger.init_done()
        record_steps(ledger, range(1, 41), loss=2.0, fetch=0.0001)
        ledger.step_start(41)
    events = read_events(tmp_path)
    old = _old_format(tmp_path, events)
    assert not list((old / "ledger").glob("*.steps"))
    assert read_events(old) == events
    new_report, old_report = load_report(tmp_path), load_report(old)
    assert old_report.to_dict() | {"run_dir": ""} == new_report.to_dict() | {"run_dir": ""}
    assert build_report(events).accounting == new_report.accounting


def test_another_ranks_job_events_are_read_and_its_spans_are_not(tmp_path: Path) -> None:
    """Of a rank other than the primary the report parses its attempt start, failures and custom events and
    its last step, and leaves its spans' lines unparsed: an unreadable one among them costs no warning."""
    for rank in (0, 1):
        with Ledger(tmp_path, rank=rank, attempt=0) as ledger:
            ledger.init_done()
            for step in range(1, 11):
                ledger.step_start(step)
                ledger.step_end(step)
            ledger.event("eval", step=10, score=0.5)
            ledger.failure_detected("peer lost")
    (tmp_path / "ledger" / "attempt-0000.index").unlink()  # rank 1 read from its files, as before the index
    with open(tmp_path / "ledger" / "attempt-0000.rank-00001.jsonl", "a") as f:
        f.write('{"event":"init_done", not json}\n{"event":"fault_injected", torn')
    with pytest.warns(UserWarning, match="torn last line") as caught:
        events, records = read_ledger(tmp_path, primary=0)
    assert len(caught) == 1
    other = [(e["event"], e.get("step")) for e in events if e["rank"] == 1]
    assert other == [("attempt_start", None), ("eval", 10), ("failure_detected", None), ("step_end", 10)]
    assert list(records) == [(0, 0)] and len(records[(0, 0)]) == 10
