"""``goodput drill``'s command line and table, without running a job: user errors are one line and exit 2, the
table shows every column, and every registered scenario is documented in docs/drill.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from goodput.drill.drill import format_table
from goodput.drill.scenario import ScenarioResult, registered
from tests.helpers.paths import ROOT


def _drill(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "goodput", "drill", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--scenarios", "rank,meteor"), "unknown scenario meteor: choose from rank"),
        (("--", "no_such_train.py"), "'no_such_train.py' does not exist"),
        (("--nproc", "0"), "need --nproc >= 1"),
        (("--nnodes", "3"), "--nnodes 1 or 2"),
        (("--soak",), "--soak needs a DURATION"),
        (("--soak", "5", "--mtbf", "10s"), "--soak '5' needs a number and a unit"),
        (("--soak", "2m", "--scenarios", "rank"), "--soak runs one job: leave out --scenarios"),
        (("--soak", "2m", "--kinds", "kill,node"), "not a soak's fault kind on 1 node(s)"),
        (
            ("--soak", "--replay", "no-such-replay.json"),
            "--replay no-such-replay.json: not a soak replay file",
        ),
    ],
)
def test_a_user_error_is_one_line_and_exit_2(args: tuple[str, ...], says: str) -> None:
    proc = _drill(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_work_dir_in_use_is_refused(tmp_path: Path) -> None:
    (tmp_path / "earlier").mkdir()
    proc = _drill("--work-dir", str(tmp_path))
    assert proc.returncode == 2 and "is not empty" in proc.stderr, proc.stderr


def test_the_table_has_a_row_per_scenario_and_says_why_identity_is_not_expected() -> None:
    rows = {
        "rank": ScenarioResult(
            injected="kill@step=5,rank=1", outcome="completed", met=True, exactly_once=True, identical=True,
            time_lost=3.25, ledger="5 attempts; goodput 61%",
        ),
        "nan": ScenarioResult(
            injected="nan@step=8,rank=1", outcome="not run", met=True, exactly_once=None, identical=None,
            not_expected="the script's numeric guard is off",
        ),
        "hang": ScenarioResult(
            injected="hang@step=5,rank=1", outcome="stopped, exit 1", met=False, exactly_once=False,
            identical=False, problems=("ended stopped, exit 1, expected completed",),
        ),
    }  # fmt: skip
    lines = format_table(rows, wide=True).splitlines()
    assert lines[0].split() == ["scenario", "met", "injected", "outcome", "exactly", "once", "identical", "time",
                                "lost", "ledger"]  # fmt: skip
    assert lines[2].split()[:2] == ["rank", "yes"] and "3.2s" in lines[2] and "goodput 61%" in lines[2]
    assert "not expected: the script's numeric guard is off" in lines[3]
    assert lines[4].split()[:2] == ["hang", "NO"]


def test_every_scenario_is_documented_with_its_outcome() -> None:
    page = (ROOT / "docs" / "drill.md").read_text()
    for name, scenario in registered().items():
        assert f"### {name}" in page, f"docs/drill.md has no section for the {name} scenario"
        assert scenario.outcome in " ".join(page.split()), f"docs/drill.md does not state {name}'s outcome"


def test_the_table_fits_120_columns_and_wide_keeps_every_cell_on_its_row() -> None:
    kills = "; ".join(f"kill@phase=checkpoint_write,step={s},rank={s % 2}" for s in range(4, 40, 4))
    ledger = "11 attempts; goodput 38%; restart 41.2s, rework 12.9s, failure_detection 10.4s"
    reason = "a NaN step is skipped, and the samples of its data window with it: " + "x" * 90
    rows = {
        "rank": ScenarioResult(
            injected=f"9 SIGKILLs ({kills})", outcome="completed", met=True, exactly_once=True, identical=True,
            time_lost=73.5, ledger=ledger,
        ),
        "nan": ScenarioResult(
            injected="nan@step=8,rank=1", outcome="completed", met=True, exactly_once=True, identical=None,
            not_expected=reason, ledger=ledger,
        ),
    }  # fmt: skip
    narrow = format_table(rows)
    assert max(len(line) for line in narrow.splitlines()) <= 120, narrow
    for text in (kills, ledger, reason):  # every cell is there, wrapped at spaces (or inside a longer word)
        assert "".join(text.split()) in "".join(narrow.split()), text
    wide = format_table(rows, wide=True).splitlines()
    assert len(wide) == 4 and max(len(line) for line in wide) > 120
    assert kills in wide[2] and ledger in wide[2] and reason in wide[3]
