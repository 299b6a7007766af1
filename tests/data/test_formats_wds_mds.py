"""WebDataset tar and Mosaic MDS specifics: brace patterns, the shard index kept in the cache, every MDS
column encoding and compression the fixtures hold, and each bad file refused with one line (not a tar, a member
without an extension, a sample lacking an extension, a truncated shard naming the sample, an MDS shard whose
hash differs, a dataset changed since the position was saved)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from goodput.data import CacheConfig, MDSDataset, ResumableLoader, WebDataset
from goodput.data._tarscan import regular_members
from goodput.data.webdataset import expand_urls
from goodput.errors import ConfigError, DataError, FingerprintMismatch
from tests.helpers.formats import MDS_FIXTURES, one_line, write_webdataset

N = 60


def _webdataset(folder: Path) -> Path:
    """N samples in 3 shards written by ``webdataset.TarWriter`` (skips where webdataset is not installed)."""
    pytest.importorskip("webdataset")
    return Path(write_webdataset(str(folder), N))


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_brace_patterns_expand_as_webdataset_does() -> None:
    assert expand_urls("s3://b/shard-{000..002}.tar") == [f"s3://b/shard-{i:03d}.tar" for i in range(3)]
    assert expand_urls(["a/{x,y}-{1..2}.tar"]) == ["a/x-1.tar", "a/x-2.tar", "a/y-1.tar", "a/y-2.tar"]


def test_webdataset_groups_members_by_key(tmp_path: Path) -> None:
    root = _webdataset(tmp_path)
    pattern = str(root / "shard-{000000..000002}.tar")
    dataset = WebDataset(pattern)
    assert len(dataset) == N and dataset.shard_sizes == [20, 20, 20]
    sample = dataset[21]
    assert sample["__key__"] == "sample00021" and sample["__url__"].endswith("shard-000001.tar")
    assert (sample["txt"], sample["cls"], sample["json"]) == (b"row 21", b"21", b'{"i": 21}')
    only = WebDataset([str(root / "shard-000001.tar")], extensions=["cls"])
    assert set(only[0]) == {"__key__", "__url__", "cls"} and len(only) == 20
    assert dataset.describe()["keys"] == ["cls", "json", "txt"]


def test_samples_are_the_ones_the_webdataset_library_reads(tmp_path: Path) -> None:
    import webdataset

    root = _webdataset(tmp_path)
    shards = sorted(str(p) for p in root.iterdir())
    theirs = [
        {k: v for k, v in sample.items() if not k.startswith("__")} | {"__key__": sample["__key__"]}
        for sample in webdataset.WebDataset(shards, shardshuffle=False, empty_check=False)
    ]
    ours = [{k: v for k, v in sample.items() if k != "__url__"} for sample in WebDataset(str(root))]
    assert len(ours) == N and ours == theirs


@pytest.mark.parametrize("form", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tar_headers_are_read_as_tarfile_reads_them(form: int) -> None:
    """The header reader's members (long names, prefixes, pax records, directories, links) equal tarfile's;
    a file it leaves to tarfile (bad checksum, global pax header, cut short, bytes after the end) gives None."""
    buf, long_dir = io.BytesIO(), "d" * 70 + "/" + "e" * 70
    with tarfile.open(fileobj=buf, mode="w", format=form) as tar:
        for i in range(12):
            for name in (f"k{i}.txt", f"{long_dir}/k{i}.cls", f"dé{i}/k{i}.json"):
                data = bytes(range(i * 37 % 256)) * (i + 1)
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 1.5 * i
                tar.addfile(info, io.BytesIO(data))
            for kind, name in ((tarfile.DIRTYPE, f"dir{i}"), (tarfile.SYMTYPE, f"link{i}.x")):
                info = tarfile.TarInfo(name)
                info.type, info.linkname = kind, "t" * (40 if form == tarfile.USTAR_FORMAT else 120)
                tar.addfile(info)
    data = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        expected = [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]
    assert len(expected) == 36 and regular_members(data) == expected
    assert regular_members(bytes(1024)) == []
    damaged = bytearray(data)
    damaged[expected[5][1] - 512] ^= 1  # a name byte of the sixth member's header: its checksum fails
    assert regular_members(bytes(damaged)) is None
    assert regular_members(data[: expected[-1][1] + 3]) is None
    assert regular_members(data + b"junk") is None
    globals_ = io.BytesIO()
    with tarfile.open(fileobj=globals_, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"a": "b"}) as tar:
        tar.addfile(tarfile.TarInfo("k.txt"), io.BytesIO(b""))
    assert regular_members(globals_.getvalue()) is None


def test_webdataset_index_is_built_once_and_kept_in_the_cache(tmp_path: Path) -> None:
    root = str(_webdataset(tmp_path))
    cache = CacheConfig(folder=str(tmp_path / "cache"), budget_bytes=1 << 30)
    first = WebDataset(root, cache=cache)
    kept = sorted(os.listdir(tmp_path / "cache" / "wds-index"))
    assert len(kept) == 3
    for shard in Path(root).iterdir():  # the indexes are used: no tar header is read again
        shard.write_bytes(shard.read_bytes()[:512] + b"\0" * (shard.stat().st_size - 512))
    again = WebDataset(root, cache=cache)
    assert sorted(os.listdir(tmp_path / "cache" / "wds-index")) == kept
    assert again.fingerprint == first.fingerprint and len(again) == N


def test_webdataset_bad_files(tmp_path: Path) -> None:
    (tmp_path / "notar").mkdir()
    (tmp_path / "notar" / "a.tar").write_bytes(b"this is not a tar file" * 40)
    one_line(DataError, r"a\.tar is not a tar file", lambda: WebDataset(str(tmp_path / "notar")))
    (tmp_path / "noext").mkdir()
    _tar(tmp_path / "noext" / "a.tar", [("k1.txt", b"a"), ("k1", b"b")])
    one_line(DataError, r"member 'k1' has no extension", lambda: WebDataset(str(tmp_path / "noext")))
    (tmp_path / "lacking").mkdir()
    _tar(tmp_path / "lacking" / "a.tar", [("k1.txt", b"a"), ("k1.cls", b"1"), ("k2.txt", b"b")])
    one_line(
        DataError,
        r"sample 'k2' \(sample 1 of the shard\) has no cls member",
        lambda: WebDataset(str(tmp_path / "lacking"), extensions=["txt", "cls"]),
    )
    root = _webdataset(tmp_path / "cut")
    shard = root / "shard-000002.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[: data.index(b"row 55") + 3])  # inside sample 55's txt member
    one_line(DataError, r"truncated at byte \d+: sample 'sample00055'", lambda: WebDataset(str(root)))
    one_line(DataError, r"missing\.tar does not exist", lambda: WebDataset([str(root / "missing.tar")] * 2))
    one_line(ConfigError, "extensions must be a list", lambda: WebDataset(str(root), extensions="txt"))


def test_mds_reads_every_encoding_and_compression() -> None:
    datasets = {
        name: MDSDataset(os.path.join(MDS_FIXTURES, name)) for name in ("plain-60", "zstd-60", "gz-60")
    }
    for dataset in datasets.values():
        assert len(dataset) == N and len(dataset.shard_sizes) >= 3
        for i in (0, 17, N - 1):
            sample = dataset[i]
            assert (sample["id"], sample["text"], sample["meta"]) == (
                i,
                f"row {i}",
                {"i": i, "odd": i % 2 == 1},
            )
            assert np.array_equal(sample["vec"], np.arange(i % 5 + 1, dtype=np.int32) + i)
            assert sample["score"] == np.float32(i / 4)
    assert datasets["plain-60"].fingerprint != datasets["zstd-60"].fingerprint
    narrow = MDSDataset(os.path.join(MDS_FIXTURES, "plain-60"), columns=["text"])
    assert narrow[3] == {"text": "row 3"} and narrow.describe()["columns"] == {"text": "str"}


def test_mds_bad_files(tmp_path: Path) -> None:
    one_line(
        ConfigError,
        r"has no column nope: its columns are",
        lambda: MDSDataset(os.path.join(MDS_FIXTURES, "plain-60"), columns=["nope"]),
    )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "index.json").write_text('{"format": "goodput-shards"}')
    one_line(DataError, r"is not an MDS index", lambda: MDSDataset(str(tmp_path / "other")))
    plain = tmp_path / "plain"
    shutil.copytree(os.path.join(MDS_FIXTURES, "plain-60"), plain)
    shard = plain / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-40])
    dataset = MDSDataset(str(plain))
    one_line(
        DataError,
        r"shard\.00001\.mds has \d+ of its \d+ bytes: it is truncated; samples 13\.\.24",
        lambda: dataset[20],
    )
    packed = tmp_path / "zstd"
    shutil.copytree(os.path.join(MDS_FIXTURES, "zstd-60"), packed)
    shard = packed / "shard.00002.mds.zstd"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    one_line(
        DataError, r"shard\.00002\.mds\.zstd: its sha1 hash differs", lambda: MDSDataset(str(packed))[30]
    )


@pytest.mark.parametrize("kind", ["webdataset", "mds"])
def test_a_changed_dataset_refuses_the_saved_position(kind: str, tmp_path: Path) -> None:
    if kind == "webdataset":
        root = _webdataset(tmp_path)
        make: Callable[[], Any] = lambda: WebDataset(str(root))  # noqa: E731
    else:
        root = tmp_path / "mds"
        shutil.copytree(os.path.join(MDS_FIXTURES, "plain-60"), root)
        make = lambda: MDSDataset(str(root), columns=["id", "text"])  # noqa: E731
    loader = ResumableLoader(make(), batch_size=4, seed=1)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    if kind == "webdataset":
        _tar(root / "shard-000003.tar", [("extra.txt", b"x")])
    else:
        index = (root / "index.json").read_text()
        (root / "index.json").write_text(index.replace('"samples": 10', '"samples": 9'))
    fresh = ResumableLoader(make(), batch_size=4, seed=1)
    one_line(
        FingerprintMismatch,
        r"the dataset differs from the one the data position was saved with: .*identity",
        lambda: fresh.load_state_dict(state),
    )
