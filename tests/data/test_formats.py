"""Parquet, Arrow (Hugging Face datasets) and token files read in place: locally, from the test S3 server
(through the cache and by ranged reads), through ResumableLoader with an exactly-once resume, and pickled
for DataLoader workers. The files are written by pyarrow, datasets and numpy themselves."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("datasets")

from goodput.data import CacheConfig, ResumableLoader
from goodput.data.order import sample_seed
from goodput.testing import S3Server
from tests.helpers.formats import BUILDERS, Builder, Together, write_all

N = 60
IDS = [pytest.param(b, id=b.name) for b in BUILDERS]


def _ids(builder: Builder, dataset: Any) -> list[int]:
    return [builder.sample_id(dataset[i]) for i in range(len(dataset))]


@pytest.mark.parametrize("builder", IDS)
def test_local_files_read_every_sample_in_order(builder: Builder, tmp_path: Path) -> None:
    dataset = builder.open(builder.write(str(tmp_path), N))
    assert len(dataset) == N
    assert _ids(builder, dataset) == list(range(N))
    assert sum(dataset.shard_sizes) == N and len(dataset.shard_sizes) >= 2
    copy = pickle.loads(pickle.dumps(dataset))  # what a spawned DataLoader worker gets
    assert _ids(builder, copy) == list(range(N))
    assert dataset.describe()["samples"] == N
    if hasattr(dataset, "__getitems__"):  # what the DataLoader calls for a batch: runs and gathers
        batch = [5, 6, 7, 40, 3, N - 1, 5]
        assert [builder.sample_id(s) for s in dataset.__getitems__(batch)] == batch


def _upload(local: str, url: str, options: dict[str, Any]) -> None:
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    fs.put(local.rstrip("/") + "/", url.removeprefix("s3://"), recursive=True)


@pytest.mark.s3
@pytest.mark.parametrize("cached", [True, False], ids=["cache", "ranged"])
@pytest.mark.parametrize("builder", IDS)
def test_s3_reads_the_same_samples(
    builder: Builder, cached: bool, tmp_path: Path, s3_server: S3Server, s3_url: str
) -> None:
    options = s3_server.storage_options()
    _upload(builder.write(str(tmp_path / "src"), N), s3_url, options)
    cache = CacheConfig(folder=str(tmp_path / "cache"), budget_bytes=1 << 30) if cached else None
    dataset = builder.open(s3_url, cache=cache, storage_options=options)
    order = list(range(N))[::-1]
    dataset.prefetch(order)  # the sampler's download plan
    assert [builder.sample_id(dataset[i]) for i in order] == order
    if cached:
        metrics = dataset.cache_metrics()
        assert metrics["bytes_downloaded"] > 0
    dataset.close()


def test_loader_resumes_every_format_exactly_once(tmp_path: Path) -> None:
    """Half an epoch over all formats at once, the position through JSON, a fresh loader for the rest."""
    urls = write_all(str(tmp_path), N)
    first = ResumableLoader(Together(urls), batch_size=4, seed=3, collate_fn=list)
    seen: list[dict[str, int]] = []
    for step, batch in enumerate(first):
        seen += batch
        if step == 6:
            break
    state = json.loads(json.dumps(first.state_dict()))
    assert len(json.dumps(state)) < 4096
    second = ResumableLoader(Together(urls), batch_size=4, seed=3, collate_fn=list)
    second.load_state_dict(state)
    for batch in second:
        seen += batch
    for name in urls:
        ids = [sample[name] for sample in seen]
        assert sorted(ids) == list(range(N)), name
    assert all(len(set(sample.values())) == 1 for sample in seen)  # the same logical sample everywhere


def _tag(sample: Any, seed: int) -> tuple[Any, int]:
    return sample, seed


@pytest.mark.parametrize("builder", IDS)
def test_augment_gets_the_per_sample_seed(builder: Builder, tmp_path: Path) -> None:
    url = builder.write(str(tmp_path), N)
    assert not hasattr(builder.open(url), "get_seeded")  # no augment: the loader hands no seeds
    dataset = builder.open(url, augment=_tag)
    loader = ResumableLoader(dataset, batch_size=5, seed=11, collate_fn=list, shard_window=2)
    for batch in loader:
        for sample, seed in batch:
            index = builder.sample_id(sample)
            assert seed == sample_seed(11, 0, index)
        break


def test_a_changed_dataset_refuses_the_saved_position(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from goodput.errors import FingerprintMismatch

    builder = BUILDERS[0]
    url = builder.write(str(tmp_path), N)
    state = ResumableLoader(builder.open(url), batch_size=4, seed=0).state_dict()
    file = Path(url) / "data" / "train-00001-of-00003.parquet"
    table = pq.read_table(file)
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), file)  # one row more
    with pytest.raises(FingerprintMismatch, match=r"identity .parquet:3files:61samples") as err:
        ResumableLoader(builder.open(url), batch_size=4, seed=0).load_state_dict(state)
    assert "\n" not in str(err.value)


def test_a_hf_dataset_is_read_through_its_arrow_files(tmp_path: Path) -> None:
    import datasets

    from goodput.data import ArrowDataset
    from goodput.errors import ConfigError

    url = BUILDERS[1].write(str(tmp_path), N)
    loaded = datasets.load_from_disk(url)
    dataset = ArrowDataset.from_hf(loaded, columns=["id"])
    assert [dataset[i] for i in (0, N - 1)] == [{"id": 0}, {"id": N - 1}]
    with pytest.raises(ConfigError, match="flatten_indices"):
        ArrowDataset.from_hf(loaded.shuffle(seed=0))
    with pytest.raises(ConfigError, match="save_to_disk"):
        ArrowDataset.from_hf(datasets.Dataset.from_dict({"id": [1, 2]}))


def test_tokens_windows_stop_at_each_file_end(tmp_path: Path) -> None:
    """a.bin holds 20 windows and 3 tokens more: those 3 are never read, b.npy's first window is sample 20."""
    url = BUILDERS[2].write(str(tmp_path), N)
    dataset = BUILDERS[2].open(url)
    assert dataset.shard_sizes == [N // 3, N - N // 3]
    assert dataset[N // 3].tolist() == [N // 3] + [7] * 7
    raw = np.fromfile(Path(url) / "a.bin", dtype=np.uint16)
    assert len(raw) == (N // 3) * 8 + 3 and raw[-3:].tolist() == [1, 2, 3]
