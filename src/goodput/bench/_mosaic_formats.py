"""Mosaic Streaming's side of ``goodput bench data --format mds``; runs in the Mosaic venv (never imports goodput).

    python _mosaic_formats.py write MDS_FOLDER ROWS SHARD_BYTES
    python _mosaic_formats.py state MDS_FOLDER POSITION
    python _mosaic_formats.py resume MDS_FOLDER STATE_JSON
    python _mosaic_formats.py epoch MDS_FOLDER SAMPLES BATCH

``write`` writes the benchmark's rows (``id`` int64, ``text`` str) with MDSWriter; ``state`` prints the
``StreamingDataset.state_dict`` of a dataset that has consumed ``POSITION`` samples of its first epoch;
``resume`` restores that state into a fresh dataset and times it to the first sample in hand; ``epoch`` times
``SAMPLES`` samples drawn in batches through a torch DataLoader. Each prints one JSON line. Every call is its own
process because a StreamingDataset holds shared memory named after its local folder for the process's life.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _dataset(folder: str, batch: int) -> Any:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    return StreamingDataset(local=folder, shuffle=False, batch_size=batch, num_canonical_nodes=1)


def write(out: str, rows: int, shard_bytes: int) -> None:
    from streaming import MDSWriter

    columns = {"id": "int64", "text": "str"}
    with MDSWriter(out=out, columns=columns, size_limit=shard_bytes, compression=None) as writer:
        for i in range(rows):
            writer.write({"id": i, "text": f"sample {i} of the benchmark corpus"})
    print(json.dumps({"rows": rows}))


def state(folder: str, position: int) -> None:
    dataset = _dataset(folder, 1)
    next(iter(dataset))  # starts epoch 0, as a training loop would have
    print(json.dumps(dataset.state_dict(position, True)))


def resume(folder: str, text: str) -> None:
    dataset = _dataset(folder, 1)
    started = time.perf_counter()
    dataset.load_state_dict(json.loads(text))
    first = next(iter(dataset))
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "first_id": int(first["id"])}))


def epoch(folder: str, samples: int, batch: int) -> None:
    from torch.utils.data import DataLoader

    dataset = _dataset(folder, batch)
    loader = DataLoader(dataset, batch_size=batch, collate_fn=lambda b: b)
    started = time.perf_counter()  # after construction, as for goodput's side
    drawn = 0
    for drawn_batch in loader:
        drawn += len(drawn_batch)
        if drawn >= samples:
            break
    print(json.dumps({"seconds": time.perf_counter() - started, "samples": drawn}))


if __name__ == "__main__":
    command, folder = sys.argv[1], sys.argv[2]
    if command == "write":
        write(folder, int(sys.argv[3]), int(sys.argv[4]))
    elif command == "state":
        state(folder, int(sys.argv[3]))
    elif command == "resume":
        resume(folder, sys.argv[3])
    else:
        epoch(folder, int(sys.argv[3]), int(sys.argv[4]))
    sys.stdout.flush()
    os._exit(0)  # a dataset left mid-epoch keeps its reader threads: do not wait for them
