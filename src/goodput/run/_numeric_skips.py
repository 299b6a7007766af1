"""The numeric guard's skip list: the data ranges a fault came back in, never trained again.

``RUN_DIR/numeric/skips.json`` holds ``[epoch, first position, end position]`` ranges; every restore applies
them to the loader's sampler, so a cold or warm restart from a checkpoint older than a skip skips it too.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["SKIPS_FILE", "apply_skips", "read_skips", "write_skips"]

SKIPS_FILE = os.path.join("numeric", "skips.json")


def read_skips(run_dir: str) -> list[tuple[int, int, int]]:
    """The run's skipped data ranges ``(epoch, first position, end position)`` (``RUN_DIR/numeric/skips.json``)."""
    try:
        with open(os.path.join(run_dir, SKIPS_FILE)) as f:
            return [(int(e), int(lo), int(hi)) for e, lo, hi in json.load(f)]
    except FileNotFoundError:
        return []


def write_skips(run_dir: str, skips: list[tuple[int, int, int]]) -> None:
    path = os.path.join(run_dir, SKIPS_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump([list(s) for s in skips], f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def apply_skips(loader: Any, skips: list[tuple[int, int, int]]) -> None:
    skip = getattr(getattr(loader, "sampler", None), "skip", None)
    if callable(skip):
        for epoch, lo, hi in skips:
            skip(epoch, lo, hi)
