"""The ``titan`` contender of ``goodput bench peers``: the baseline's job checkpointed by torchtitan's own code.

    PYTHONPATH=<the bench's torchtitan folder>:$PYTHONPATH GOODPUT_RUN_DIR=runs/x \
        torchrun --standalone --nproc-per-node 2 --max-restarts 50 src/goodput/bench/_peers_titan.py \
        --data runs/x/data --steps 800 --every 40

torchtitan 0.3.0 (installed by the bench on first use, ``bench/_peers_titan_launch.py``), driven as its trainer
drives it: its ``CheckpointManager`` with ``async_mode="async"`` (DCP ``async_save`` in a gloo group of its own,
the previous save awaited before the next), ``interval`` ``--every``, its defaults otherwise (the last
``keep_latest_k=10`` steps kept, a synchronous model-only save at the last step, the newest ``step-N/`` with a
``.metadata`` loaded on a restart); its ``OptimizersContainer`` (AdamW, the demo's settings, its for-loop
implementation as PyTorch's default on CPU), its ``LRSchedulersContainer`` (the demo's LR factor), its
``ParallelAwareDataloader`` (torchdata's StatefulDataLoader, its state saved per data-parallel rank) over the
demo's shards in the baseline's order, and a train state of the step and the tokens seen, as its trainer's.
The model, the loop and the bench's bookkeeping (step records, ledger) are the baseline's
(``bench/_peers_baseline.py``). The one part torchtitan has that this job does not use is
``async_with_pinned_mem``: it stages into pinned and shared memory with CUDA streams.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig

from goodput.bench._peers_baseline import demo_args, demo_data, demo_job, demo_lr_lambda, finish, train
from goodput.demo.prepare import CONTEXT
from goodput.ledger import Ledger


class _TrainState:
    """What torchtitan's trainer saves of itself under ``train_state``."""

    def __init__(self) -> None:
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.ntokens_seen = int(state["step"]), int(state["ntokens_seen"])


def main(argv: list[str] | None = None) -> None:
    args = demo_args(argv, __doc__)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    dist.init_process_group("gloo")
    ledger = Ledger(run_dir)
    inner, _, _ = demo_job(args)  # the seeded model; torchtitan's containers build the optimizer and schedule
    model = torch.nn.parallel.DistributedDataParallel(inner)
    adamw = {"lr": args.lr, "weight_decay": 0.01}
    config = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs=adamw)],
        implementation="for-loop",
    )
    optimizers = OptimizersContainer(config, model_parts=[inner])
    schedulers = LRSchedulersContainer(optimizers, demo_lr_lambda(args.steps))
    rank, world = dist.get_rank(), dist.get_world_size()
    sampler, loader = demo_data(args, ParallelAwareDataloader, dp_rank=rank, dp_world_size=world)
    state = _TrainState()
    checkpointer = CheckpointManager(
        CheckpointManager.Config(enable=True, folder="checkpoints", interval=args.every, async_mode="async"),
        dataloader=loader,
        model_parts=[inner],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={"train_state": state},
        sd_adapter=None,
        base_folder=run_dir,
    )
    ledger.restore_start()
    ledger.restore_end(state.step if checkpointer.load() else None)
    ledger.init_done()
    saves = _Saves(checkpointer, ledger, args.every, args.steps)

    def after_step(step: int) -> None:
        state.step = step
        state.ntokens_seen += args.batch_size * world * CONTEXT
        saves.after(step)

    train(args, model, (optimizers, schedulers), (sampler, loader), state.step, ledger, after_step)
    checkpointer.close()
    finish(run_dir, inner, ledger)


class _Saves:
    """``CheckpointManager.save`` after every step, as torchtitan's trainer calls it, timed into the ledger: the
    stall of a step that saves, and the save's durability once its background write has finished."""

    def __init__(self, checkpointer: Any, ledger: Any, every: int, steps: int) -> None:
        self.checkpointer, self.ledger, self.every, self.steps = checkpointer, ledger, every, steps
        self.pending: tuple[int, float, float] | None = None

    def after(self, step: int) -> None:
        self.poll()
        last = step == self.steps
        if not (last or step % self.every == 0):  # torchtitan's own rule (CheckpointManager._should_save)
            return
        start = time.monotonic()
        self.ledger.event("checkpoint_stall", phase="start", step=step)
        self.checkpointer.maybe_wait_for_saving()  # what save() does first: here, to record that save durable
        self.poll()
        self.checkpointer.save(step, last_step=last)
        stall = time.monotonic() - start
        self.ledger.event("checkpoint_stall", phase="end", step=step, seconds=stall)
        self.pending = (step, stall, start)
        if last:  # the last save is synchronous: durable already
            self.poll()

    def poll(self) -> None:
        """Record the pending save as durable once torchtitan's future for it is done (or it has none)."""
        future = self.checkpointer.save_future
        if self.pending is None or (future is not None and not future.done()):
            return
        step, stall, start = self.pending
        persist = time.monotonic() - start - stall
        self.ledger.event("checkpoint_durable", step=step, stall_seconds=stall, persist_seconds=persist)
        self.pending = None


if __name__ == "__main__":
    main()
