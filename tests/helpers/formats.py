"""Small real datasets in every in-place format, written by the format's own library, whose logical sample
``i`` carries the id ``i`` (the format tests and the multi-format SIGKILL test import this).

``BUILDERS`` is the list of formats: each writes ``n`` samples under a local folder, opens them (at that folder
or wherever they were copied, e.g. the test S3 server) and reads a sample's id back. Add a format by adding a
builder; the multi-format exactly-once test then covers it too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.helpers.paths import FIXTURES

SEQ_LEN = 7  # token windows of 8 tokens


@dataclass(frozen=True)
class Builder:
    """One format: ``write(folder, n) -> the dataset's path under folder``; ``open(url, **options)``;
    ``sample_id(sample) -> int``."""

    name: str
    write: Callable[[str, int], str]
    open: Callable[..., Any]
    sample_id: Callable[[Any], int]


def write_parquet(folder: str, n: int) -> str:
    """A Hub-style export: ``data/train-0000k-of-00003.parquet`` (row groups of 7) and a test split beside."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = os.path.join(folder, "parquet")
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    bounds = np.linspace(0, n, 4).astype(int)
    for k in range(3):
        ids = list(range(bounds[k], bounds[k + 1]))
        table = pa.table({"id": ids, "text": [f"row {i}" for i in ids], "label": [i % 3 for i in ids]})
        pq.write_table(table, os.path.join(root, "data", f"train-{k:05d}-of-00003.parquet"), row_group_size=7)
    pq.write_table(
        pa.table({"id": [-1], "text": ["x"], "label": [0]}),
        os.path.join(root, "data", "test-00000-of-00001.parquet"),
    )
    return root


def open_parquet(url: str, **options: Any) -> Any:
    from goodput.data import ParquetDataset

    return ParquetDataset(url, split="train", columns=["id", "text"], **options)


def write_arrow(folder: str, n: int) -> str:
    """A Hugging Face ``datasets`` folder written by ``save_to_disk`` in 3 Arrow files."""
    import datasets

    root = os.path.join(folder, "arrow")
    ds = datasets.Dataset.from_dict({"id": list(range(n)), "text": [f"row {i}" for i in range(n)]})
    ds.save_to_disk(root, num_shards=3)
    return root


def open_arrow(url: str, **options: Any) -> Any:
    from goodput.data import ArrowDataset

    return ArrowDataset(url, **options)


def write_tokens(folder: str, n: int) -> str:
    """Two token files: a raw uint16 ``.bin`` with 3 tokens past its last window, then a uint16 ``.npy``.
    Window ``i`` (over both files) is ``SEQ_LEN + 1`` tokens, the first of which is ``i``."""
    root = os.path.join(folder, "tokens")
    os.makedirs(root, exist_ok=True)
    width, first = SEQ_LEN + 1, n // 3
    windows = np.arange(n, dtype=np.uint16)[:, None] * np.ones(width, dtype=np.uint16)
    windows[:, 1:] = 7  # the rest of each window: any token
    np.concatenate([windows[:first].ravel(), np.array([1, 2, 3], np.uint16)]).tofile(
        os.path.join(root, "a.bin")
    )
    np.save(os.path.join(root, "b.npy"), windows[first:].ravel())
    return root


def open_tokens(url: str, **options: Any) -> Any:
    from goodput.data import TokenDataset

    return TokenDataset(url, seq_len=SEQ_LEN, dtype="uint16", **options)


MDS_FIXTURES = str(FIXTURES / "mds")


def write_webdataset(folder: str, n: int) -> str:
    """Three tar shards written by ``webdataset.TarWriter`` (``key.txt``, ``key.cls``, ``key.json`` per
    sample); sample ``i``'s ``cls`` is ``i``."""
    import webdataset

    root = os.path.join(folder, "webdataset")
    os.makedirs(root, exist_ok=True)
    bounds = np.linspace(0, n, 4).astype(int)
    for k in range(3):
        with webdataset.TarWriter(os.path.join(root, f"shard-{k:06d}.tar")) as sink:
            for i in range(bounds[k], bounds[k + 1]):
                sample = {
                    "txt": f"row {i}".encode(),
                    "cls": str(i).encode(),
                    "json": f'{{"i": {i}}}'.encode(),
                }
                sink.write({"__key__": f"sample{i:05d}", **sample})
    return root


def open_webdataset(url: str, **options: Any) -> Any:
    from goodput.data import WebDataset

    return WebDataset(url, extensions=["cls", "txt"], **options)


def write_mds(folder: str, n: int) -> str:
    """An MDS dataset written by Mosaic's MDSWriter (committed fixtures, tests/scripts/make_mds_fixtures.py):
    zstd-compressed shards for 60 samples, raw ones for 96."""
    import shutil

    name = {60: "zstd-60", 96: "plain-96"}[n]
    root = os.path.join(folder, "mds")
    shutil.copytree(os.path.join(MDS_FIXTURES, name), root)
    return root


def open_mds(url: str, **options: Any) -> Any:
    from goodput.data import MDSDataset

    return MDSDataset(url, columns=["id", "text"], **options)


def cls_id(sample: Mapping[str, Any]) -> int:
    return int(sample["cls"])


def row_id(row: Mapping[str, Any]) -> int:
    return int(row["id"])


def window_id(window: Any) -> int:
    return int(window[0])


BUILDERS: list[Builder] = [
    Builder("parquet", write_parquet, open_parquet, row_id),
    Builder("arrow", write_arrow, open_arrow, row_id),
    Builder("tokens", write_tokens, open_tokens, window_id),
    Builder("webdataset", write_webdataset, open_webdataset, cls_id),
    Builder("mds", write_mds, open_mds, row_id),
]


class Together:
    """Sample ``i`` of every format at once, as ``{format: id}`` (module-level: DataLoader workers pickle it)."""

    def __init__(self, urls: Mapping[str, str], **options: Any) -> None:
        builders = {b.name: b for b in BUILDERS}
        self.parts = {name: builders[name].open(url, **options) for name, url in urls.items()}
        sizes = {len(d) for d in self.parts.values()}
        assert len(sizes) == 1, f"the formats hold different sample counts: {sizes}"

    def __len__(self) -> int:
        return len(next(iter(self.parts.values())))

    def __getitem__(self, index: int) -> dict[str, int]:
        builders = {b.name: b for b in BUILDERS}
        return {name: builders[name].sample_id(part[index]) for name, part in self.parts.items()}


def write_all(folder: str, n: int) -> dict[str, str]:
    """Every format's dataset of ``n`` samples under ``folder``: format -> local path."""
    return {b.name: b.write(folder, n) for b in BUILDERS}


def one_line(error: type[Exception], pattern: str, make: Callable[[], Any]) -> None:
    """That ``make()`` raises ``error`` with a message of one line that matches ``pattern``."""
    import pytest  # here, not at the top: the ranks that import this module need no pytest

    with pytest.raises(error) as caught:
        make()
    message = str(caught.value)
    assert "\n" not in message and re.search(pattern, message), message
