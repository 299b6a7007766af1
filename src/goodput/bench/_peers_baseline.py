"""The baseline of ``goodput bench peers``: the demo's job as a careful user builds it from PyTorch alone.

    torchrun --standalone --nproc-per-node 2 --max-restarts 30 src/goodput/bench/_peers_baseline.py \
        --data runs/x/remote-data --steps 800 --every 40

What torchtitan does, on the demo's model, optimizer, schedule and data: torchrun restarts the whole group,
DCP ``async_save`` of the model, optimizer, scheduler and train step every ``--every`` steps into
``step-N/`` folders (each in its own gloo group, the previous save awaited before the next, as torchtitan's
``async_mode="async"``), and each rank's data position from torchdata's ``StatefulDataLoader`` saved under a
per-rank key (torchtitan's ``dp_rank_<r>``). A restart loads the newest folder whose ``.metadata`` exists (DCP
writes it last). No memory tier, no warm restarts, no RNG state: torchtitan keeps none of these. The samples
are read in order, split over the ranks by ``DistributedSampler(shuffle=False)`` (torchtitan streams its
datasets in order); ``--every 0`` takes no checkpoint at all (the bare loop).

Not part of the baseline, for the bench's bookkeeping only: each rank logs the samples of every step it
trains (``<run_dir>/samples/rank-<r>.jsonl``, as the demo does) and writes goodput's ledger (a thin wrapper:
steps, restores and checkpoint stalls), so ``goodput report`` accounts for its time as for goodput's own runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torchdata.stateful_dataloader import StatefulDataLoader

from goodput.data import ShardedDataset
from goodput.demo.model import ModelConfig, TinyLM
from goodput.demo.train import collate, decode, next_byte_loss, save_final_model
from goodput.ledger import Ledger

_BLOB = 1 << 16  # bytes of JSON kept per non-tensor state (DCP loads into tensors of the saved shape)


def demo_args(
    argv: list[str] | None = None, doc: str | None = __doc__, *, saves: str = "checkpoint"
) -> argparse.Namespace:
    """The options of a contender's script, the same in each (``doc``: the script's own docstring; ``saves``:
    what ``--every`` does, in its help)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the demo's shard folder")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--every", type=int, default=40, help=f"{saves} every N steps (0: never)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1)
    return p.parse_args(argv)


def _blob(value: Any) -> torch.Tensor:
    """A JSON value as a fixed-size byte tensor: safe to load (no pickle), the same shape on every save."""
    data = json.dumps(value).encode()
    assert len(data) <= _BLOB, f"state of {len(data)} bytes does not fit the {_BLOB}-byte blob"
    out = torch.full((_BLOB,), ord(" "), dtype=torch.uint8)
    out[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


def _unblob(blob: torch.Tensor) -> Any:
    return json.loads(bytes(blob.numpy()).decode())


def _newest(root: str) -> int | None:
    """The newest step whose DCP checkpoint is complete (its ``.metadata`` exists)."""
    if not os.path.isdir(root):
        return None
    steps = [int(n[5:]) for n in os.listdir(root) if n.startswith("step-") and n[5:].isdigit()]
    done = [s for s in steps if os.path.exists(os.path.join(root, f"step-{s}", ".metadata"))]
    return max(done, default=None)


def demo_job(args: argparse.Namespace) -> tuple[TinyLM, torch.optim.Optimizer, Any]:
    """The demo's model (seeded), AdamW and LR schedule, the same in every contender written here."""
    torch.manual_seed(args.seed)
    inner = TinyLM(ModelConfig(dropout=0.1))
    optimizer = torch.optim.AdamW(inner.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, demo_lr_lambda(args.steps))
    return inner, optimizer, scheduler


def demo_lr_lambda(steps: int) -> Callable[[int], float]:
    """The demo's LR factor at a step: a linear warmup over a tenth of the run, then a linear decay to 0.1."""
    warmup = max(1, steps // 10)
    return lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1 - s / steps)


def demo_loader(
    dataset: Any,
    sampler: Any,
    args: argparse.Namespace,
    loader_class: Any = StatefulDataLoader,
    **kwargs: Any,
) -> Any:
    """torchdata's StatefulDataLoader (or ``loader_class``, a subclass) over the demo's shards in ``sampler``'s
    order."""
    return loader_class(
        dataset,
        **kwargs,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        collate_fn=collate,
        drop_last=True,
        persistent_workers=args.workers > 0,
    )


def main(argv: list[str] | None = None) -> None:
    args = demo_args(argv)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ledger = Ledger(run_dir)
    ckpt_group = dist.new_group(backend="gloo")  # async saves' collectives apart from training's
    inner, optimizer, scheduler = demo_job(args)
    model = torch.nn.parallel.DistributedDataParallel(inner)
    sampler, loader = demo_data(args, StatefulDataLoader)
    root = os.path.join(run_dir, "checkpoints")
    step = _restore(root, model, optimizer, scheduler, loader, rank, ledger)
    ledger.init_done()
    saver = _AsyncSaver(root, ckpt_group, ledger)

    def after_step(step: int) -> None:
        saver.poll()
        if args.every and step % args.every == 0 and step < args.steps:
            saver.save(step, _state(model, optimizer, scheduler, loader, step, rank))

    train(args, model, (optimizer, scheduler), (sampler, loader), step, ledger, after_step)
    saver.wait()
    finish(run_dir, inner, ledger)


def demo_data(args: argparse.Namespace, loader_class: Any, **kwargs: Any) -> tuple[Any, Any]:
    """The demo's shards in order, split over the ranks by ``DistributedSampler(shuffle=False)``, and a
    ``loader_class`` (torchdata's StatefulDataLoader or a subclass, given ``kwargs`` too) over them."""
    dataset = ShardedDataset(args.data, decode=decode)
    sampler: torch.utils.data.distributed.DistributedSampler[Any] = (
        torch.utils.data.distributed.DistributedSampler(
            dataset,  # type: ignore[arg-type]  # a map-style dataset without the Dataset base class
            shuffle=False,
            drop_last=True,
        )
    )
    return sampler, demo_loader(dataset, sampler, args, loader_class, **kwargs)


def train(
    args: argparse.Namespace,
    model: Any,
    schedule: tuple[Any, Any],
    data: tuple[Any, Any],
    step: int,
    ledger: Any,
    after_step: Callable[[int], None],
) -> None:
    """The loop, from ``step`` to ``--steps``: each step logged (the bench's records), trained, then handed to
    ``after_step`` (the checkpointing)."""
    (optimizer, scheduler), (sampler, loader) = schedule, data
    run_dir, rank = os.environ["GOODPUT_RUN_DIR"], dist.get_rank()
    per_epoch = len(loader)
    sampler.set_epoch(step // per_epoch)
    os.makedirs(os.path.join(run_dir, "samples"), exist_ok=True)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(os.path.join(run_dir, "samples", f"rank-{rank}.jsonl"), "a", buffering=1) as log:
        while step < args.steps:
            for indices, batch in loader:
                ledger.step_start(step + 1)
                loss = next_byte_loss(model, torch.from_numpy(batch))
                # logged before the gradients leave this rank, as the demo does (goodput/demo/train.py)
                log.write(json.dumps({"step": step + 1, "samples": indices, "attempt": restarts}) + "\n")
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                step += 1
                ledger.step_end(step, loss=float(loss.detach()))
                after_step(step)
                if step >= args.steps:
                    break
            else:
                sampler.set_epoch(step // per_epoch)


def finish(run_dir: str, inner: torch.nn.Module, ledger: Any) -> None:
    """Rank 0 keeps the final model (the bench's held-out loss); the ledger and the process group close."""
    if dist.get_rank() == 0:
        save_final_model(run_dir, inner)
    ledger.close()
    dist.destroy_process_group()


def _state(model: Any, optimizer: Any, scheduler: Any, loader: Any, step: int, rank: int) -> dict[str, Any]:
    msd, osd = get_state_dict(model, optimizer)
    return {
        "model": msd,
        "optim": osd,
        "lr_scheduler": _blob(scheduler.state_dict()),
        "train_state": torch.tensor(step),
        "dataloader": {f"dp_rank_{rank}": _blob(loader.state_dict())},
    }


def _restore(
    root: str, model: Any, optimizer: Any, scheduler: Any, loader: Any, rank: int, ledger: Any
) -> int:
    """Load the newest complete checkpoint into everything; the step it holds (0: none)."""
    step = _newest(root)
    ledger.restore_start()
    if step is None:
        ledger.restore_end(None)
        return 0
    state = _state(model, optimizer, scheduler, loader, 0, rank)
    dcp.load(state, checkpoint_id=os.path.join(root, f"step-{step}"))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    scheduler.load_state_dict(_unblob(state["lr_scheduler"]))
    loader.load_state_dict(_unblob(state["dataloader"][f"dp_rank_{rank}"]))
    step = int(state["train_state"])
    ledger.restore_end(step)
    return step


class _AsyncSaver:
    """DCP ``async_save`` as torchtitan's async mode uses it: wait for the previous save, then stage and go."""

    def __init__(self, root: str, group: Any, ledger: Any) -> None:
        self.root, self.group, self.ledger = root, group, ledger
        self.future: Any = None
        self.pending: tuple[int, float, float] | None = None
        options = StagingOptions(False, False, False, False)  # CPU: no pinned or shared memory, no streams
        self.stager = DefaultStager(options)

    def save(self, step: int, state: dict[str, Any]) -> None:
        start = time.monotonic()
        self.ledger.event("checkpoint_stall", phase="start", step=step)
        self.wait()
        self.future = dcp.async_save(
            state,
            checkpoint_id=os.path.join(self.root, f"step-{step}"),
            process_group=self.group,
            async_stager=self.stager,
        )
        stall = time.monotonic() - start
        self.ledger.event("checkpoint_stall", phase="end", step=step, seconds=stall)
        self.pending = (step, stall, start)

    def poll(self) -> None:
        """Record the previous save as durable once its background write has finished."""
        if self.future is not None and self.future.done():
            self.wait()

    def wait(self) -> None:
        if self.future is None or self.pending is None:
            return
        self.future.result()
        step, stall, start = self.pending
        persist = time.monotonic() - start - stall
        self.ledger.event("checkpoint_durable", step=step, stall_seconds=stall, persist_seconds=persist)
        self.future = self.pending = None


if __name__ == "__main__":
    main()
