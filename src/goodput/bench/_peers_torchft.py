"""The torchft contender of ``goodput bench peers``: the demo's job written the way torchft's DDP example is.

    torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000 --bind 127.0.0.1:PORT
    REPLICA_GROUP_ID=0 NUM_REPLICA_GROUPS=2 TORCHFT_LIGHTHOUSE=http://127.0.0.1:PORT GOODPUT_RUN_DIR=runs/x \
        torchrun --standalone --nproc-per-node 1 --max-restarts 50 src/goodput/bench/_peers_torchft.py \
        --data runs/x/data --steps 800 --every 40
    (and the same with REPLICA_GROUP_ID=1)

torchft 0.2.0 (the ``peers`` extra): one replica group per rank, each its own torchrun that restarts only that
group; a ``Manager`` that forms a quorum with the lighthouse at every step, its gloo process group, its
``DistributedDataParallel`` and ``OptimizerWrapper`` (a step is applied only when every participant commits),
``PGTransport`` for live recovery (a restarted group heals the model, optimizer and step from a healthy
one), and torchft's ``DistributedSampler`` sharding the data over the replica groups. Timeouts are the
example's (gloo 5 s, manager 30 s, transport 10 s). As the example's closing comment recommends, each group
also saves its model, optimizer, manager and data-loader state every ``--every`` steps (``torch.save`` of its
own file, renamed into place), so that a job whose groups all die at once resumes from there; a group that
finds a healthier peer at its first quorum heals from it instead. Its data position is its own: torchft does
not transfer it on a heal (its sampler is "inherently lossy", its documentation says).

For the bench's bookkeeping only, as in the baseline: each group logs the samples of every step it commits while
participating (``<run_dir>/samples/rank-<group>.jsonl``, ``attempt`` = the quorum's id: a step redone in a later
quorum replaces the earlier records), and writes goodput's ledger as rank ``<group>``.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any

import torch
from torchft import DistributedDataParallel, DistributedSampler, Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing.pg_transport import PGTransport

from goodput.bench._peers_baseline import demo_args, demo_job, demo_loader
from goodput.data import ShardedDataset
from goodput.demo.train import decode, next_byte_loss, save_final_model
from goodput.ledger import Ledger


def main(argv: list[str] | None = None) -> None:
    args = demo_args(argv, __doc__, saves="save this group's state")
    torch.set_num_threads(1)
    group = int(os.environ["REPLICA_GROUP_ID"])
    groups = int(os.environ.get("NUM_REPLICA_GROUPS", "2"))
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    ledger = Ledger(run_dir, rank=group)
    inner, optim, scheduler = demo_job(args)
    dataset = ShardedDataset(args.data, decode=decode)
    sampler = DistributedSampler(
        dataset,
        replica_rank=group,
        num_replica_groups=groups,
        group_rank=0,
        num_replicas=1,
        shuffle=False,
        drop_last=True,
    )
    loader = demo_loader(dataset, sampler, args)

    def load_state_dict(state: dict[str, Any]) -> None:
        inner.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        scheduler.load_state_dict(state["lr_scheduler"])

    def state_dict() -> dict[str, Any]:
        return {
            "model": inner.state_dict(),
            "optim": optim.state_dict(),
            "lr_scheduler": scheduler.state_dict(),
        }

    pg = ProcessGroupGloo(timeout=timedelta(seconds=5))
    manager = Manager(
        pg=pg,
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"peers_torchft_{group}",
        hostname="127.0.0.1",
        timeout=timedelta(seconds=30),
        checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=10), device=torch.device("cpu")),
    )
    model = DistributedDataParallel(manager, inner)
    optimizer = Optimizer(manager, optim)
    folder = os.path.join(run_dir, "checkpoints", f"replica-{group}")
    ledger.restore_start()
    restored = _restore(folder, inner, optim, scheduler, manager, loader)
    ledger.restore_end(restored)
    ledger.init_done()
    os.makedirs(os.path.join(run_dir, "samples"), exist_ok=True)
    with open(os.path.join(run_dir, "samples", f"rank-{group}.jsonl"), "a", buffering=1) as log:
        _train(args, model, optimizer, scheduler, manager, loader, sampler, ledger, log, folder)
    if group == 0:  # the groups end on the same model: one keeps it (the bench's held-out loss)
        save_final_model(run_dir, inner)
    ledger.close()
    manager.shutdown()


def _train(
    args: Any,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    manager: Any,
    loader: Any,
    sampler: Any,
    ledger: Any,
    log: Any,
    folder: str,
) -> None:
    epoch = 0
    while manager.current_step() < args.steps:
        sampler.set_epoch(epoch)
        for indices, batch in loader:
            step = manager.current_step()
            ledger.step_start(step + 1)
            optimizer.zero_grad()  # starts the quorum
            loss = next_byte_loss(model, torch.from_numpy(batch))
            loss.backward()
            participating = manager.is_participating()
            optimizer.step()  # applied only if every participant commits
            if manager.current_step() == step:
                continue  # not committed: the quorum changed under the step
            step = manager.current_step()
            if participating:
                log.write(
                    json.dumps({"step": step, "samples": indices, "attempt": manager._quorum_id}) + "\n"
                )
            scheduler.step()
            ledger.step_end(step, loss=float(loss.detach()))
            if args.every and step % args.every == 0 and step < args.steps:
                _save(folder, step, model.module, optimizer.optim, scheduler, manager, loader, ledger)
            if step >= args.steps:
                return
        epoch += 1


def _save(
    folder: str, step: int, inner: Any, optim: Any, scheduler: Any, manager: Any, loader: Any, ledger: Any
) -> None:
    start = time.monotonic()
    ledger.event("checkpoint_stall", phase="start", step=step)
    os.makedirs(folder, exist_ok=True)
    state = {
        "model": inner.state_dict(),
        "optim": optim.state_dict(),
        "lr_scheduler": scheduler.state_dict(),
        "torchft": manager.state_dict(),
        "dataloader": loader.state_dict(),
    }
    path = os.path.join(folder, f"step-{step}.pt")
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)
    stall = time.monotonic() - start
    ledger.event("checkpoint_stall", phase="end", step=step, seconds=stall)
    ledger.event("checkpoint_durable", step=step, stall_seconds=stall, persist_seconds=0.0)


def _restore(folder: str, inner: Any, optim: Any, scheduler: Any, manager: Any, loader: Any) -> int | None:
    """Load this group's newest saved state, if any; the step it holds."""
    try:
        steps = [int(n[5:-3]) for n in os.listdir(folder) if n.startswith("step-") and n.endswith(".pt")]
    except FileNotFoundError:
        return None
    if not steps:
        return None
    state = torch.load(os.path.join(folder, f"step-{max(steps)}.pt"), weights_only=True)
    inner.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    scheduler.load_state_dict(state["lr_scheduler"])
    manager.load_state_dict(state["torchft"])
    loader.load_state_dict(state["dataloader"])
    return max(steps)


if __name__ == "__main__":
    main()
