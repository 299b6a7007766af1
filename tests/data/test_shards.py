"""Sharded and folder datasets: writer/reader round trips at s3://, memory:// and local URLs, through the cache
and straight from the store; prefetch in sample order; pickling for DataLoader workers; the CLI writer."""

from __future__ import annotations

import argparse
import json
import pickle
import random

import fsspec
import pytest

from goodput.cli import data as data_cli
from goodput.data.cache import CacheConfig
from goodput.data.folder import FolderDataset
from goodput.data.shards import ShardedDataset, write_folder_shards, write_shards
from goodput.errors import ConfigError, DataError
from goodput.testing import S3Server
from goodput.testing.faultproxy import FaultProxy
from tests.helpers.cache_helpers import via

pytestmark = pytest.mark.s3


def _samples(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(0, 3000)) for _ in range(n)]


def _config(tmp_path, **kw) -> CacheConfig:
    return CacheConfig(folder=str(tmp_path / "cache"), budget_bytes=10**7, prefetch_bytes=10**6, **kw)


def test_s3_round_trip_through_cache_and_direct(tmp_path, s3_server: S3Server, s3_url: str) -> None:
    samples = _samples(200)
    index = write_shards(samples, s3_url, shard_bytes=40_000, storage_options=s3_server.storage_options())
    assert index["samples"] == 200 and len(index["shards"]) > 3
    cached = ShardedDataset(s3_url, cache=_config(tmp_path), storage_options=via(s3_server))
    direct = ShardedDataset(s3_url, storage_options=via(s3_server))
    assert len(cached) == len(direct) == 200
    assert sum(cached.shard_sizes) == 200 and cached.shard_sizes == [s["samples"] for s in index["shards"]]
    order = list(range(200))
    random.Random(1).shuffle(order)
    assert [cached[i] for i in order] == [samples[i] for i in order]
    assert [direct[i] for i in range(0, 200, 17)] == samples[::17]
    assert cached[-1] == samples[-1]
    with pytest.raises(IndexError):
        cached[200]
    assert cached.fingerprint == direct.fingerprint


def test_memory_and_local_urls_and_decode(tmp_path) -> None:
    samples = [json.dumps({"i": i}).encode() for i in range(50)]
    write_shards(samples, "memory://gp-shards/ds", shard_bytes=200)
    mem = ShardedDataset("memory://gp-shards/ds", cache=_config(tmp_path), decode=json.loads)
    assert [mem[i]["i"] for i in range(50)] == list(range(50))
    local = str(tmp_path / "local-ds")
    write_shards(samples, local, shard_bytes=10_000)
    assert [ShardedDataset(local, decode=json.loads)[i]["i"] for i in range(50)] == list(range(50))


def test_open_shards_are_bounded_pinned_and_read_the_same(tmp_path) -> None:
    samples = _samples(60, seed=3)
    local = str(tmp_path / "ds")
    write_shards(samples, local, shard_bytes=8_000)  # several shards
    ds = ShardedDataset(local, cache=_config(tmp_path), open_shards=2)
    assert len(ds.shard_sizes) >= 4
    order = list(range(len(samples)))
    random.Random(1).shuffle(order)
    index = ds._source.cache._index

    def pinned() -> int:
        with index._db() as db:
            return int(db.execute("SELECT COUNT(DISTINCT key) FROM pins").fetchone()[0])

    for i in order:
        assert ds[i] == samples[i]
        assert pinned() <= 2  # never more shards held from eviction than asked for
    opens = ds.cache_metrics()["hits"] + ds.cache_metrics()["misses"]
    assert opens < len(order)  # a shard still open is read without opening it again
    ds.close()
    assert pinned() == 0
    with pytest.raises(ConfigError, match="open_shards"):
        ShardedDataset(local, open_shards=0)


def test_prefetch_fetches_shards_in_sample_order(tmp_path, s3_server: S3Server, s3_url: str) -> None:
    samples = _samples(120, seed=2)
    write_shards(samples, s3_url, shard_bytes=30_000, storage_options=s3_server.storage_options())
    with FaultProxy(s3_server.s3_port) as proxy:
        ds = ShardedDataset(
            s3_url,
            cache=_config(tmp_path, prefetch_workers=1),
            storage_options=via(s3_server, proxy.endpoint_url),
        )
        n_shards = len(ds.shard_sizes)
        shard_order = list(reversed(range(n_shards)))
        indices = [
            i for s in shard_order for i in range(sum(ds.shard_sizes[:s]), sum(ds.shard_sizes[: s + 1]))
        ]
        ds.prefetch(indices)
        assert [ds[i] for i in indices] == [samples[i] for i in indices]
        ds.close()
        fetched = [
            r.path.rsplit("/", 1)[-1] for r in proxy.records() if r.method == "GET" and "shard-" in r.path
        ]
    assert fetched == [f"shard-{s:06d}.gpshard" for s in shard_order]


def test_pickled_copy_reads_the_same(tmp_path, s3_server: S3Server, s3_url: str) -> None:
    samples = _samples(30, seed=3)
    write_shards(samples, s3_url, shard_bytes=5_000, storage_options=s3_server.storage_options())
    ds = ShardedDataset(s3_url, cache=_config(tmp_path), storage_options=via(s3_server))
    assert ds[3] == samples[3]  # leaves a shard open: must not travel
    copy = pickle.loads(pickle.dumps(ds))
    assert [copy[i] for i in range(30)] == samples


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_dataloader_workers_read_through_one_cache(tmp_path, s3_server: S3Server, s3_url: str) -> None:
    from torch.utils.data import DataLoader

    samples = _samples(64, seed=4)
    write_shards(samples, s3_url, shard_bytes=8_000, storage_options=s3_server.storage_options())
    ds = ShardedDataset(s3_url, cache=_config(tmp_path), storage_options=via(s3_server))
    ds.prefetch(list(range(64)))  # the main process prefetches; forked workers read
    loader = DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda b: b)
    assert list(loader) == samples
    counted = ds.cache_metrics()
    assert counted["hits"] + counted["misses"] >= len(ds.shard_sizes)  # the workers' reads, node-wide
    ds.close()


def test_folder_dataset(tmp_path, s3_server: S3Server, s3_url: str) -> None:
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3_server.storage_options())
    contents = {f"{s3_url}/img/{i:02d}.txt": f"sample {i}".encode() for i in range(12)}
    contents[f"{s3_url}/img/README.md"] = b"not a sample"
    fs.pipe(contents)
    ds = FolderDataset(
        s3_url,
        decode=bytes.decode,
        suffixes=[".txt"],
        cache=_config(tmp_path),
        storage_options=via(s3_server),
    )
    assert len(ds) == 12
    ds.prefetch(list(range(11, -1, -1)))
    assert [ds[i] for i in range(12)] == [f"sample {i}" for i in range(12)]
    direct = FolderDataset(s3_url, decode=bytes.decode, suffixes=[".txt"], storage_options=via(s3_server))
    assert direct[5] == "sample 5" and direct.fingerprint == ds.fingerprint
    assert pickle.loads(pickle.dumps(ds))[7] == "sample 7"
    assert s3_server.secret_key not in repr(ds) + repr(ds._source)
    ds.close()
    with pytest.raises(DataError, match="holds no files"):
        FolderDataset(s3_url, decode=bytes.decode, suffixes=[".png"], storage_options=via(s3_server))


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="goodput")
    data_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli_writes_a_folder_as_shards(tmp_path, capsys) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(9):
        (src / ("sub" if i % 2 else "") / f"{i}.bin").write_bytes(bytes([i]) * (i + 1))
    args = _cli(["data", "write", str(src), str(tmp_path / "out"), "--shard-size", "10B", "--json"])
    assert args.handler(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples"] == 9 and summary["shards"] > 1
    ds = ShardedDataset(str(tmp_path / "out"))
    names = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.bin"))
    assert [ds[i] for i in range(9)] == [(src / n).read_bytes() for n in names]
    bad = _cli(["data", "write", str(tmp_path / "nope"), str(tmp_path / "out2")])
    with pytest.raises(ConfigError, match="is not a directory"):
        bad.handler(bad)
    with pytest.raises(ConfigError, match="holds no files"):
        (tmp_path / "empty").mkdir()
        write_folder_shards(str(tmp_path / "empty"), "memory://x")
