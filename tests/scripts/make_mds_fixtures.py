"""Write the MDS fixtures of the tests with Mosaic's own MDSWriter (the files are committed; rerun to remake).

    pip install --no-deps --target /tmp/mds mosaicml-streaming==0.13.0 zstd Brotli python-snappy catalogue
    # plus the torchvision stand-in of goodput.bench._mosaic_venv._STANDIN under /tmp/mds/torchvision
    PYTHONPATH=/tmp/mds python tests/scripts/make_mds_fixtures.py tests/fixtures/mds

Sample ``i`` has ``id`` = i (int), ``text`` (str), ``meta`` (json), ``vec`` (ndarray, dynamic shape) and
``score`` (float32); small ``size_limit`` so every dataset has several shards.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
from streaming import MDSWriter

COLUMNS = {"id": "int", "text": "str", "meta": "json", "vec": "ndarray", "score": "float32"}


def sample(i: int) -> dict[str, object]:
    return {
        "id": i,
        "text": f"row {i}",
        "meta": {"i": i, "odd": i % 2 == 1},
        "vec": np.arange(i % 5 + 1, dtype=np.int32) + i,
        "score": np.float32(i / 4),
    }


def write(folder: str, n: int, compression: str | None) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    with MDSWriter(
        out=folder, columns=COLUMNS, compression=compression, hashes=["sha1", "xxh64"], size_limit=1200
    ) as out:
        for i in range(n):
            out.write(sample(i))


if __name__ == "__main__":
    root = sys.argv[1]
    for n in (60, 96):
        write(os.path.join(root, f"plain-{n}"), n, None)
    write(os.path.join(root, "zstd-60"), 60, "zstd:7")
    write(os.path.join(root, "gz-60"), 60, "gz")
