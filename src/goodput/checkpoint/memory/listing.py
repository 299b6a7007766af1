"""What the memory tier holds on this machine, and the name of a run's memory folder (for ``goodput ls`` and
the tier's set-up; reading the folders needs no process group)."""

from __future__ import annotations

import os
from typing import Any

from goodput.checkpoint.memory.store import MemoryStore, MemoryTier

__all__ = ["list_memory_checkpoints", "run_identity"]


def run_identity(root: str, token: str) -> str:
    """The memory folder name of the run whose durable root is ``root`` and whose id file holds ``token``."""
    import hashlib

    return f"{hashlib.sha1(root.encode()).hexdigest()[:10]}-{token}"


def list_memory_checkpoints(
    root: str, folder: str = "/dev/shm/goodput", storage_options: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The memory-tier checkpoints of the run whose durable root is ``root`` that this machine holds.

    One row per node folder and step (own parts and replicas apart): ``node``, ``step``, ``kind`` (``own`` or
    ``replica``), ``ranks`` (those with a marker), ``unmarked`` (parts without one) and ``bytes``. Empty when
    the run has no memory tier here.
    """
    from goodput.checkpoint.durable.layout import CheckpointLayout
    from goodput.checkpoint.memory.setup import RUN_ID_FILE

    layout = CheckpointLayout(root, storage_options)
    try:
        token = layout.read_text(layout.join(RUN_ID_FILE)).strip()
    except FileNotFoundError:
        return []
    base = os.path.join(folder, run_identity(layout.root, token))
    rows: list[dict[str, Any]] = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if not name.startswith("node-") or not name[5:].isdigit():
            continue
        store = MemoryStore(MemoryTier(folder=folder), os.path.basename(base), int(name[5:]))
        for replica in (False, True):
            for step in store.steps(replica=replica):
                parts = store.ranks_in(step, replica=replica)
                marked = [
                    r
                    for r in parts
                    if os.path.exists(store.part_path(step, r, replica=replica)[:-5] + ".json")
                ]
                size = sum(os.path.getsize(store.part_path(step, r, replica=replica)) for r in parts)
                rows.append({"node": store.node, "step": step, "kind": "replica" if replica else "own",
                             "ranks": marked, "unmarked": sorted(set(parts) - set(marked)), "bytes": size})  # fmt: skip
    return rows
