"""A run that reads through the data cache: its ledger gets ``cache_stats``, report.json shows them, and the
advice does not tell it to enable the cache; each attempt declares the cache (``cache_config``) for a soak."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import goodput as gp
from goodput.data.shards import write_shards
from goodput.ledger import read_events


def _decode(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(data, dtype=np.float32).copy())


def _train(run_dir: Path, url: str, cache: gp.CacheConfig) -> None:
    """Two epochs of 4 steps over the 32 samples at ``url``, read through ``cache``."""
    dataset = gp.ShardedDataset(url, cache=cache, decode=_decode)
    loader = gp.ResumableLoader(dataset, batch_size=8, seed=0)  # 4 steps an epoch
    run = gp.Run(str(run_dir), total_steps=8, progress=False, hang_timeout=None)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run.restore(model=model, optimizer=opt, loader=loader)
    for batch in run.batches(loader):
        model(batch).square().mean().backward()
        opt.step()
        opt.zero_grad()
        run.step_done()
    run.close()
    dataset.close()


def _shards(tmp_path: Path) -> str:
    url = str(tmp_path / "remote")
    write_shards((np.full(4, i, np.float32).tobytes() for i in range(32)), url, shard_bytes=64)
    return url


def test_a_cached_run_records_cache_stats(tmp_path: Path) -> None:
    cache = gp.CacheConfig(folder=str(tmp_path / "cache"), budget_bytes=1 << 20)
    run_dir = tmp_path / "run"
    url = _shards(tmp_path)
    _train(run_dir, url, cache)
    report = gp.load_report(str(run_dir)).to_dict()
    stats = report["info"]["cache_stats"]
    assert stats, "the cache was used: report.json must show its counters"
    by_epoch = {s["epoch"]: s for s in stats}
    assert sorted(by_epoch) == [0, 1]
    # the first epoch downloaded every shard, each read waiting for it (a miss) or fetched ahead of it by the
    # prefetcher (a hit: on a busy machine the prefetcher can win every race)
    shard_bytes = sum(p.stat().st_size for p in Path(url).glob("*.gpshard"))
    assert by_epoch[0]["bytes_downloaded"] == shard_bytes > 0
    assert by_epoch[0]["hits"] + by_epoch[0]["misses"] > 0
    assert by_epoch[1]["misses"] == 0 and by_epoch[1]["hits"] > 0  # the second read them from the cache
    assert by_epoch[1]["bytes_downloaded"] == 0
    assert not any("enable the local cache" in a["text"] for a in report["advice"])


def test_each_attempt_declares_its_cache_folder_budget_and_usage_for_the_soak(tmp_path: Path) -> None:
    url = _shards(tmp_path)
    cache = gp.CacheConfig(folder=str(tmp_path / "cache"), budget_bytes=1 << 20)
    _train(tmp_path / "cold", url, cache)  # downloads every shard into the cache
    _train(tmp_path / "warm", url, cache)  # finds them there
    held = sum(f.stat().st_size for f in (tmp_path / "cache" / "files").iterdir())
    assert held > 0
    for name, usage in (("cold", 0), ("warm", held)):
        declared = [e for e in read_events(tmp_path / name) if e["event"] == "cache_config"]
        assert [(e["folder"], e["budget_bytes"], e["usage_bytes"]) for e in declared] == [
            (str(tmp_path / "cache"), 1 << 20, usage)
        ], name
    report = gp.load_report(str(tmp_path / "warm")).to_dict()
    assert [c["usage_bytes"] for c in report["info"]["cache_config"]] == [held]
    assert "cache_config" not in report["info"]["custom"]
