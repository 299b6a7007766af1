"""The soak's sampler and the data cache: it finds the cache a job declared in its ledger, reads the bytes the
budget counts (files and downloads in flight, not private uncached copies) and stops the soak at the first
reading over the budget; a job that declared none is not checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

import goodput as gp
from goodput.data._cacheindex import owner_token
from goodput.data.shards import write_shards
from goodput.drill.soak_leaks import Sampler
from goodput.ledger import Ledger


def _sampler(run_dir: Path) -> Sampler:
    return Sampler(str(run_dir), "train.py", clock=lambda: 1.0, warmup=10.0)


def _cached_dataset(tmp_path: Path, budget: int) -> gp.ShardedDataset:
    """A dataset of 32 samples in 8 shards, every shard read once through a cache of ``budget`` bytes."""
    url = str(tmp_path / "remote")
    write_shards((np.full(4, i, np.float32).tobytes() for i in range(32)), url, shard_bytes=64)
    cache = gp.CacheConfig(folder=str(tmp_path / "cache"), budget_bytes=budget)
    dataset = gp.ShardedDataset(url, cache=cache, decode=bytes)
    for i in range(len(dataset)):
        dataset[i]
    return dataset


def test_the_sampler_reads_the_declared_cache_and_stops_at_the_first_reading_over_its_budget(
    tmp_path: Path,
) -> None:
    budget = 64 << 10
    dataset = _cached_dataset(tmp_path, budget)
    declared = dataset.cache_usage()
    used = declared["usage_bytes"]
    assert used > 0 and declared["folder"] == str(tmp_path / "cache")
    run_dir = tmp_path / "run"
    ledger = Ledger(run_dir, rank=0)
    ledger.cache_config(**declared)
    ledger.close()
    sampler = _sampler(run_dir)
    sampler.sample()
    assert [(r.folder, r.held, r.budget) for r in sampler.cache] == [(declared["folder"], used, budget)]
    assert not sampler.leaked
    folder = tmp_path / "cache"
    # a private copy read when the budget had no room is outside it by design
    (folder / "uncached" / "k.1-2.1").write_bytes(b"x" * budget)
    sampler.sample()
    assert sampler.cache[-1].held == used and not sampler.leaked
    # a download whose process was killed is left out, as the cache leaves it out (and removes it at its next start)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    dead = owner_token(child.pid).replace(":", "-")  # named while it runs, then ended
    child.communicate(b"")
    (folder / "tmp" / f"k.{dead}.part").write_bytes(b"x" * budget)
    sampler.sample()
    assert sampler.cache[-1].held == used and not sampler.leaked
    # a download in flight is counted: one that takes the cache past its budget stops the soak
    live = owner_token().replace(":", "-")
    (folder / "tmp" / f"k.{live}.part").write_bytes(b"x" * (budget - used + 1))
    sampler.sample()
    assert sampler.cache[-1].held == budget + 1
    assert sampler.leaked == (
        f"the data cache {folder} held {budget + 1} bytes at 1.0s, over its budget of {budget} bytes"
    )
    dataset.close()


def test_a_job_is_not_checked_until_an_attempt_declares_its_cache_and_then_from_that_reading_on(
    tmp_path: Path,
) -> None:
    dataset = _cached_dataset(tmp_path, 64 << 10)
    run_dir = tmp_path / "run"
    first = Ledger(run_dir, rank=0)
    first.init_done()
    first.close()
    sampler = _sampler(run_dir)
    sampler.sample()
    assert sampler.node and not sampler.cache and not sampler.leaked  # no cache declared: none checked
    later = Ledger(run_dir, rank=0)  # the next attempt, reading through the cache
    later.cache_config(**dataset.cache_usage())
    later.close()
    sampler.sample()
    assert [r.held for r in sampler.cache] == [dataset.cache_usage()["usage_bytes"]]
    dataset.close()
