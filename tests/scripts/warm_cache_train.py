"""A user's warm-restartable script whose ``train(run)`` builds its dataset: shards on S3 through a small cache.

    goodput launch --restart warm --nproc 2 --run-dir runs/w -- tests/scripts/warm_cache_train.py \
        --url s3://bucket/data --cache DIR --options '{"key": ...}' --steps 16

Each entry of ``train`` makes a new ``ShardedDataset`` (its own cache prefetch) and a ``ResumableLoader`` with
two workers and ``shard_window=2``, as a user who rebuilds everything after a warm restart would. On each
entry, once restored (before the first batch), every process appends what of an earlier generation is still
running in it to ``<run_dir>/entries.jsonl``: the cache's prefetch threads and the DataLoader worker processes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import threading

import numpy as np
import torch
from _readme_loop import fit

import goodput as gp

FEATURES = 8
_entries = 0  # entries of ``train`` in this process: 2 and more in a survivor of a warm restart


def decode(data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    """A sample's bytes: FEATURES float32 inputs, then its float32 target."""
    values = torch.from_numpy(np.frombuffer(data, dtype=np.float32).copy())
    return values[:FEATURES], values[FEATURES:]


def record_entry(run: gp.Run) -> None:
    """Append this entry's view of what earlier generations left running in this process."""
    global _entries
    _entries += 1
    entry = {
        "rank": run.info.rank,
        "pid": os.getpid(),
        "entry": _entries,
        "cache_threads": sorted(
            t.name for t in threading.enumerate() if t.name.startswith(("goodput-cache", "goodput-fetch"))
        ),
        "workers": len(multiprocessing.active_children()),
    }
    with open(os.path.join(run.run_dir, "entries.jsonl"), "a") as f:
        f.write(json.dumps(entry) + "\n")


def train(run: gp.Run, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    cache = gp.CacheConfig(folder=args.cache, budget_bytes=args.budget, wait_seconds=0.5)
    dataset = gp.ShardedDataset(
        args.url, cache=cache, decode=decode, storage_options=json.loads(args.options)
    )
    loader = gp.ResumableLoader(dataset, batch_size=4, seed=0, num_workers=2, shard_window=2, drop_last=True)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1)
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run.restore(model=model, optimizer=opt, loader=loader)
    record_entry(run)  # restored, not yet iterated: nothing of this entry's own runs yet
    fit(run, loader, lambda b: torch.nn.functional.mse_loss(model(b[0]), b[1]), opt)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--cache", required=True)
    p.add_argument("--options", required=True, help="storage options as JSON")
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    run = gp.Run(
        checkpoint=gp.CheckpointConfig(root=os.path.join(run_dir, "checkpoints"), every=4),
        total_steps=args.steps,
        backend="gloo",
        progress=False,
    )
    run.warm(lambda r: train(r, args))


if __name__ == "__main__":
    main()
