"""Where the tests' files are: the repository, the test scripts, the committed fixtures."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SCRIPTS = TESTS / "scripts"
FIXTURES = TESTS / "fixtures"


def script(name: str) -> str:
    """The path of one of tests/scripts/, as a string for a command line."""
    return str(SCRIPTS / name)


FSDP_TRAIN = script("fsdp_train.py")  # a model-sharded (FSDP2) training script, for the drill
