"""Listing the checkpoints while retention removes some: a folder removed during the scan is no checkpoint.

A rank's scan reads each step folder's files; retention (after an async save) or a rollback discarding newer
steps can remove a folder between the listing of the root and the reading of its manifest: that folder is no
checkpoint, not an error (which would stop a rollback) and not a corrupt one. Real threads, real folders.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState
from goodput.checkpoint.durable.layout import MANIFEST_NAME, CheckpointLayout

STEPS = 60


def test_a_scan_beside_removals_lists_only_whole_checkpoints(tmp_path: Path) -> None:
    model = torch.nn.Linear(64, 64)
    config = CheckpointConfig(root=str(tmp_path), strategy="dcp", every=1, keep_last=STEPS + 1)
    manager = CheckpointManager(config, TrainingState(model=model))
    for step in range(1, STEPS + 1):
        manager.save(step)
    manager.close()
    layout = CheckpointLayout(str(tmp_path))
    every = layout.scan()
    assert [r.status for r in every] == ["committed"] * STEPS

    scanning = threading.Event()

    def remove_all() -> None:
        scanning.wait()  # the removals begin while a scan is under way
        for row in every:
            layout.remove(row)

    remover = threading.Thread(target=remove_all)
    remover.start()
    scans: list[list[tuple[int, str]]] = []
    while True:
        scanning.set()
        scans.append([(r.step, r.status) for r in layout.scan()])  # raised FileNotFoundError on the old code
        if not remover.is_alive():
            break
    remover.join()
    seen = [row for scan in scans for row in scan]
    assert {status for _, status in seen} <= {"committed"}, sorted(
        set(seen) - {(s, "committed") for s, _ in seen}
    )
    assert layout.scan() == []


def test_a_listing_that_raced_a_local_removal_is_no_checkpoint(tmp_path: Path) -> None:
    # the interleaving the scan above meets now and then: the root was listed with the folder in it, then the
    # removal renamed the folder away and deleted its files (the manifest among them) as the folder was listed,
    # so that listing holds files but no manifest
    manager = CheckpointManager(CheckpointConfig(root=str(tmp_path), strategy="dcp"), TrainingState())
    manager.save(7)
    manager.close()
    layout = CheckpointLayout(str(tmp_path))
    [row] = layout.scan()
    root, listed = layout._names(str(tmp_path)), layout._sizes(row.url)
    assert MANIFEST_NAME in listed and len(listed) > 1
    layout.remove(row)
    layout._names = lambda folder: root  # type: ignore[method-assign]
    layout._sizes = lambda folder: {n: s for n, s in listed.items() if n != MANIFEST_NAME}  # type: ignore[method-assign]
    assert layout.scan() == []
