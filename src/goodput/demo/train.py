"""The demo's training script: a byte-level transformer LM on sharded text, made resilient by goodput.Run.

Run by ``goodput demo`` and ``goodput verify-resume`` through torchrun; by hand:

    goodput launch --nproc 2 --max-restarts 10 --run-dir runs/x -- src/goodput/demo/train.py \
        --data runs/x/data --steps 300

Every rank logs the sample indices of each step it trains (``<run_dir>/samples/rank-<r>.jsonl``; a redone step
is logged again, with rank 0's attempt number), with the step's random draws (``draws``: a hash of the
augmented batch and the loss's bits, which depend on the dropout masks). The record is written after the
forward pass and before the backward pass shares the rank's gradients: a rank killed once they are summed may
leave its peers to complete the step (a warm restart adopts it), and the log must still hold its samples; a
step logged by a rank that died earlier is redone under a newer attempt, whose records replace it. Rank 0
writes ``<run_dir>/final.json`` with hashes of the final model and optimizer state, so two runs can be
compared bit for bit, and the final model's weights (``<run_dir>/final-model.pt``), so it can be evaluated
(``goodput bench peers`` computes its loss on held-out samples).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
from typing import Any

import numpy as np
import torch

from goodput._env import RUN_DIR
from goodput.checkpoint import CheckpointConfig, MemoryTier
from goodput.data import CacheConfig, ResumableLoader, ShardedDataset
from goodput.demo.augment import ByteNoise
from goodput.demo.model import ModelConfig, TinyLM
from goodput.run import Run
from goodput.run.numeric import NumericConfig
from goodput.run.stragglers import StragglerConfig
from goodput.verify.demo import batch_epoch

INDEX = struct.Struct("<I")
FINAL_MODEL = "final-model.pt"  # in the run folder: the final model's state dict, written by rank 0


def decode(sample: bytes) -> tuple[int, torch.Tensor]:
    """A shard sample is a 4-byte sample id and the text window's bytes."""
    (index,) = INDEX.unpack_from(sample)
    return index, torch.frombuffer(bytearray(sample[INDEX.size :]), dtype=torch.uint8)


def collate(items: list[tuple[int, torch.Tensor]]) -> tuple[list[int], np.ndarray]:
    """Sample ids and a (batch, window) int64 array.

    An array, not a tensor: a DataLoader worker hands a tensor over in shared memory, one file descriptor
    sent over a fresh socket per batch, while a small array travels inside the pickle (the
    demo's batch is 8 KiB). The training loop wraps it with ``torch.from_numpy`` (no copy).
    """
    return [i for i, _ in items], np.stack([t.numpy() for _, t in items]).astype(np.int64)


def tensor_hash(tensors: dict[str, Any]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in sorted key order."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        value = tensors[key]
        if isinstance(value, dict):
            digest.update(f"{key}:{tensor_hash(value)}".encode())
        elif isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            digest.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(f"{key}:{value!r}".encode())
    return digest.hexdigest()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="URL of the sharded corpus")
    p.add_argument("--cache-dir", default=None, help="local cache folder (default: <run_dir>/cache)")
    p.add_argument("--cache-budget", type=int, default=64 << 20, help="cache budget in bytes")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--global-batch",
        type=int,
        default=0,
        help="samples a step over all ranks, on any world size (a shrink in place needs it; default: "
        "--batch-size per rank)",
    )
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategy", default="dcp_async")
    p.add_argument("--every", default="auto", help="steps (int), a duration, or auto")
    p.add_argument("--mtbf", type=float, default=None, help="expected seconds between failures (for auto)")
    p.add_argument("--checkpoint-root", default=None, help="default: <run_dir>/checkpoints")
    p.add_argument(
        "--memory-every", default="auto", help="memory-tier saves: steps, a duration, auto, or off"
    )
    p.add_argument("--memory-folder", default="/dev/shm/goodput", help="the memory tier's RAM folder")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument(
        "--shard-window", type=int, default=2, help="shards shuffled together (0: shuffle every sample)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--hang-timeout", type=float, default=120.0)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--stragglers", action="store_true", help="turn on the straggler detector (defaults)")
    p.add_argument("--dropout", type=float, default=0.1, help="the model's dropout (default 0.1)")
    p.add_argument("--augment", type=float, default=0.02, help="byte-noise probability in the workers")
    p.add_argument(
        "--numeric", action="store_true", help="the numeric guard at its defaults (goodput demo turns it on)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.use_deterministic_algorithms(True)
    # The thread count changes the order of float sums: fix it, so runs on any node layout agree bit for bit
    # (torchrun sets OMP_NUM_THREADS=1 only for several processes per node).
    torch.set_num_threads(args.threads)
    run_dir = RUN_DIR.get()
    every: int | str = int(args.every) if args.every.isdigit() else args.every
    config = CheckpointConfig(
        root=args.checkpoint_root or os.path.join(run_dir, "checkpoints"),
        strategy=args.strategy,
        every=every,
        keep_last=2,
        memory=_memory_tier(args.memory_every, args.memory_folder, keep=4 if args.numeric else 2),
        # the demo's failure rate, as the prior of the auto interval: one failure per mtbf seconds
        **({"gpus": 1, "afr": 365 * 86400 / args.mtbf} if args.mtbf else {}),
    )
    run = Run(
        run_dir,
        checkpoint=config,
        total_steps=args.steps,
        hang_timeout=args.hang_timeout,
        progress=not args.no_progress,
        backend="gloo",  # the demo trains on the CPU, also on a machine with GPUs
        # A corrupted replica rolls back to a checkpoint at or before the last replica check that agreed; at
        # this run's short auto intervals the checkpoints kept (2 durable, 4 in memory) span a few tens of
        # steps, so the replicas are compared every 10 steps rather than 50 (one parameter pass each).
        numeric=NumericConfig(check_every=10) if args.numeric else False,
        stragglers=StragglerConfig() if args.stragglers else None,
    )
    cache = CacheConfig(
        folder=args.cache_dir or os.path.join(run_dir, "cache"),
        budget_bytes=args.cache_budget,
        prefetch_bytes=min(args.cache_budget, 8 << 20),
    )
    shards = ShardedDataset(args.data, decode=decode, cache=cache)
    dataset: Any = ByteNoise(shards, args.augment) if args.augment > 0 else shards
    # Under `goodput launch --restart warm` the training is re-entered in this process after a peer fails
    # (the dataset and its cache are kept); otherwise it runs once.
    kept: dict[str, Any] = {}  # the loader built by the first entry, kept (with its workers) by the others
    run.warm(lambda r: _train(r, args, dataset, run_dir, kept))
    dataset.close()  # stop the cache's prefetch threads before the interpreter exits


def _train(run: Run, args: argparse.Namespace, dataset: Any, run_dir: str, kept: dict[str, Any]) -> None:
    """One entry of the training: builds the model and optimizer, restores, trains, closes.

    The loader is built once per process: a survivor of a warm restart keeps its rank, so it keeps the loader
    and its persistent worker processes, and only the position is put back (to the start, then whatever the
    restore finds), instead of forking new workers and waiting for their first batches.
    """
    torch.manual_seed(args.seed)
    inner = TinyLM(ModelConfig(dropout=args.dropout))
    model: torch.nn.Module = inner
    if run.info.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(inner)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1 - s / args.steps)
    )
    loader = _loader(args, dataset, kept)
    run.restore(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
    os.makedirs(os.path.join(run_dir, "samples"), exist_ok=True)
    log_path = os.path.join(run_dir, "samples", f"rank-{run.info.rank}.jsonl")
    attempt = _rank0_attempt(run)
    with open(log_path, "a", buffering=1) as samples_log:
        for indices, batch in run.batches(loader):
            tokens = torch.from_numpy(batch)
            loss = next_byte_loss(model, tokens)
            draws = [hashlib.sha256(tokens.numpy().tobytes()).hexdigest()[:16], float(loss.detach()).hex()]
            record = {
                "step": run.step + 1, "samples": indices, "attempt": attempt, "epoch": batch_epoch(loader),
                "draws": draws,
            }  # fmt: skip
            samples_log.write(json.dumps(record) + "\n")  # before the gradients leave this rank (docstring)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            run.step_done(loss=float(loss.detach()))
    run.close()
    if run.info.rank == 0:
        final = {
            "step": run.step,
            "model_sha256": tensor_hash(inner.state_dict()),
            "optimizer_sha256": tensor_hash(optimizer.state_dict()["state"]),
        }
        with open(os.path.join(run_dir, "final.json"), "w") as f:
            json.dump(final, f)
        save_final_model(run_dir, inner)


def save_final_model(run_dir: str, model: torch.nn.Module) -> None:
    """The final model's state dict at ``<run_dir>/final-model.pt``, renamed into place once written whole."""
    path = os.path.join(run_dir, FINAL_MODEL)
    torch.save(model.state_dict(), path + ".tmp")
    os.replace(path + ".tmp", path)


def _loader(args: argparse.Namespace, dataset: Any, kept: dict[str, Any]) -> ResumableLoader:
    """This process's loader, at the start of the data (a kept one is rewound; the restore moves it on)."""
    if "loader" not in kept:
        kept["loader"] = ResumableLoader(
            dataset,
            batch_size=None if args.global_batch else args.batch_size,
            global_batch_size=args.global_batch or None,
            seed=args.seed,
            num_workers=args.workers,
            persistent_workers=args.workers > 0,
            collate_fn=collate,
            drop_last=True,
            # Samples shuffled within windows of a few shards (shards shuffled too): each worker opens a shard
            # once per window instead of for nearly every sample (each open costs more than a sample).
            shard_window=args.shard_window or None,
        )
        kept["start"] = kept["loader"].state_dict()
    loader: ResumableLoader = kept["loader"]
    loader.load_state_dict(kept["start"])
    return loader


def _rank0_attempt(run: Run) -> int:
    """Rank 0's attempt number (it grows over restarts and relaunches, whatever the world size)."""
    box = [run.attempt]
    if run.info.world_size > 1:
        import torch.distributed as dist

        dist.broadcast_object_list(box, src=0)
    return int(box[0])


def _memory_tier(every: str, folder: str, *, keep: int) -> MemoryTier | None:
    """The memory tier; the numeric guard's rollback of a corrupted replica goes back to the last replica check
    that agreed (up to 50 steps, several memory saves at the auto interval), so with the guard on the tier keeps
    4 saves, enough to reach it without the durable tier."""
    if every == "off":
        return None
    return MemoryTier(every=int(every) if every.isdigit() else every, folder=folder, keep=keep)


def next_byte_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of each next byte of a batch of windows (batch, window) given the bytes before."""
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


if __name__ == "__main__":
    main()
