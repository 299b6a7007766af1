"""What the benchmarks that launch whole jobs (``goodput bench control``, ``peers``, ``restart``) share: their
output options, the folder their runs go to, and one ``goodput launch`` run to its end."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["add_output_arguments", "launch", "print_result", "work_folder"]


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json`` (one JSON object instead of the table) and ``--keep DIR`` (the run folders kept under DIR)."""
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep", default=None, help="keep the run folders under this folder")


def print_result(
    result: dict[str, Any], as_json: bool, print_table: Callable[[dict[str, Any]], None]
) -> None:
    """``result`` as one JSON object (``--json``), else as ``print_table`` prints it."""
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


@contextlib.contextmanager
def work_folder(keep: str | None, name: str) -> Iterator[str]:
    """The folder a benchmark's runs go to: ``keep/<name>-<time>`` when kept, else a temporary folder removed
    when the block ends."""
    if keep:
        yield os.path.join(keep, f"{name}-{int(time.time())}")
        return
    with tempfile.TemporaryDirectory(prefix=f"goodput-bench-{name}-") as work:
        yield work


def launch(command: Sequence[str], what: str) -> None:
    """Run one job's ``command`` to its end (at most 30 minutes).

    Raises:
        RuntimeError: it failed; the message names ``what`` and ends with its output's last lines.
    """
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the {what} failed ({proc.returncode}): {proc.stderr[-2000:]}")
