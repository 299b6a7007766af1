"""A run folder that is a file is a one-line user error, wherever it is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.cli import main
from goodput.errors import ConfigError
from goodput.ledger import Ledger


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "runs"
    path.write_text("not a folder")
    return path


def test_the_ledger_refuses_a_file(a_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"run folder '.*runs' is a file: give a folder"):
        Ledger(a_file)


@pytest.mark.parametrize("command", [["demo", "--run-dir", "{f}"], ["report", "{f}"]])
def test_the_command_line_says_so_in_one_line(
    command: list[str], a_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([part.format(f=a_file) for part in command]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(a_file) in err and ("is a file" in err or "is not a folder" in err)
