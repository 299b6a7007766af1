"""Mosaic Streaming's side of ``goodput bench cache``; runs in the separate Mosaic venv (never imports goodput).

    python _mosaic_epoch.py write GOODPUT_SHARD_FOLDER MDS_FOLDER SHARD_BYTES
    python _mosaic_epoch.py epoch s3://bucket/mds LOCAL_CACHE_FOLDER PREDOWNLOAD

``write`` copies the samples of goodput's local shards, in order, into Mosaic's MDS format; ``epoch`` reads every
sample once with StreamingDataset (credentials and endpoint come from the environment) and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from collections.abc import Iterator


def _goodput_samples(folder: str) -> Iterator[bytes]:
    with open(os.path.join(folder, "index.json")) as f:
        index = json.load(f)
    for shard in index["shards"]:
        with open(os.path.join(folder, shard["file"]), "rb") as f:
            data = f.read()
        count = struct.unpack("<Q", data[8:16])[0]
        offsets = struct.unpack(f"<{count + 1}Q", data[16 : 16 + 8 * (count + 1)])
        base = 16 + 8 * (count + 1)
        for i in range(count):
            yield data[base + offsets[i] : base + offsets[i + 1]]


def write(src: str, out: str, shard_bytes: int) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"data": "bytes"}, size_limit=shard_bytes, compression=None) as writer:
        for sample in _goodput_samples(src):
            writer.write({"data": sample})


def epoch(remote: str, local: str, predownload: int) -> None:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    dataset = StreamingDataset(
        remote=remote, local=local, shuffle=False, batch_size=1, predownload=predownload, download_retry=5
    )
    started = time.perf_counter()  # after construction (the index download), as for goodput's epochs
    total, count = 0, 0
    for sample in dataset:
        total += len(sample["data"])
        count += 1
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "samples": count, "bytes": total}))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        epoch(sys.argv[2], sys.argv[3], int(sys.argv[4]))
