"""The Hugging Face Trainer's ``checkpoint-N`` folders as checkpoint rows (for ``goodput ls`` and the resume).

The Trainer saves into ``output_dir/checkpoint-N``: the model, the optimizer and scheduler, one RNG file per
rank (``rng_state_<r>.pth``, or ``rng_state.pth`` for one process), and last ``trainer_state.json`` (rank 0).
``GoodputTrainer`` then writes each rank's data position beside them (:data:`DATA_FILE`). A folder is
``committed`` when the Trainer's state and every rank's data position are there, ``partial`` when a save was
cut short. A plain Trainer's checkpoint (no data position at all) is committed, and the row says that
GoodputTrainer does not resume from it. Local folders only (the Trainer writes to a local ``output_dir``);
transformers is not imported.
"""

from __future__ import annotations

import json
import os
import re

from goodput.checkpoint.durable.manifest import CheckpointInfo

__all__ = ["DATA_FILE", "list_trainer_checkpoints", "resumable_trainer_checkpoint"]

DATA_FILE = "goodput-data-rank{rank}.json"
STRATEGY = "hf_trainer"
_FOLDER = re.compile(r"^checkpoint-(\d+)$")
_RNG = re.compile(r"^rng_state_(\d+)\.pth$")
_DATA = re.compile(r"^goodput-data-rank(\d+)\.json$")
_TRAINER_STATE = "trainer_state.json"
NOT_GOODPUT = "no goodput data position: saved by a plain Trainer, GoodputTrainer does not resume from it"


def list_trainer_checkpoints(output_dir: str) -> list[CheckpointInfo]:
    """Every ``checkpoint-N`` folder in ``output_dir`` with its status, newest first (empty: none)."""
    try:
        names = os.listdir(output_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    rows = [
        _row(os.path.join(output_dir, name), int(m[1]))
        for name in names
        if (m := _FOLDER.match(name)) and os.path.isdir(os.path.join(output_dir, name))
    ]
    return sorted(rows, key=lambda r: -r.step)


def resumable_trainer_checkpoint(output_dir: str, rank: int) -> str | None:
    """The newest committed folder holding ``rank``'s data position (None: none).

    Every rank of the saving run must have written its position, so that all ranks of the resumed run, which
    read the same folder, choose the same checkpoint.
    """
    for row in list_trainer_checkpoints(output_dir):
        if row.status == "committed" and os.path.exists(os.path.join(row.url, DATA_FILE.format(rank=rank))):
            return row.url
    return None


def _row(folder: str, step: int) -> CheckpointInfo:
    names = os.listdir(folder)
    data = {int(m[1]) for n in names if (m := _DATA.match(n))}
    world = _world_size(folder, names, data)
    status, reason = "committed", ""
    if _TRAINER_STATE not in names:
        status, reason = "partial", f"no {_TRAINER_STATE}: the Trainer's save did not finish"
    elif not data:
        reason = NOT_GOODPUT
    elif missing := sorted(set(range(world or 1)) - data):
        status = "partial"
        reason = f"no goodput data position of rank {', '.join(map(str, missing))}: a save cut short"
    state = os.path.join(folder, _TRAINER_STATE)
    return CheckpointInfo(
        step=step,
        url=folder,
        status=status,
        reason=reason,
        strategy=STRATEGY,
        world_size=world,
        wall_time=os.path.getmtime(state) if os.path.exists(state) else None,
        size_bytes=sum(_size(os.path.join(folder, n)) for n in names),
    )


def _world_size(folder: str, names: list[str], data: set[int]) -> int | None:
    """The saving run's ranks: as its data position says (ResumableLoader's holds it), else as the files show.

    The files alone can undercount: a rank killed before its RNG file leaves no trace of itself.
    """
    for rank in sorted(data):
        try:
            with open(os.path.join(folder, DATA_FILE.format(rank=rank))) as f:
                position = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(position, dict) and isinstance(position.get("world_size"), int):
            return int(position["world_size"])
    ranks = {int(m[1]) for n in names if (m := _RNG.match(n))} | data
    if ranks:
        return max(ranks) + 1
    return 1 if "rng_state.pth" in names else None


def _size(path: str) -> int:
    if os.path.isdir(path):
        return sum(_size(os.path.join(path, n)) for n in os.listdir(path))
    return os.path.getsize(path)
