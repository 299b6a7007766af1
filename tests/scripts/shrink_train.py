"""A small DDP training that keeps its global batch on any world size, for the shrink-and-grow tests.

    goodput launch --restart warm --nproc 3 --spares 0 --shrink-after 0 --run-dir runs/s -- \
        tests/scripts/shrink_train.py --steps 18

The loader is given ``global_batch_size=12`` (12 samples a step on 1, 2, 3 or 4 ranks). Every rank logs the
sample ids of each step it trains with the world size in force (``<run_dir>/samples/rank-<r>.jsonl``), and
rank 0 writes ``<run_dir>/final.json`` with hashes of the final model and optimizer state. The model has dropout,
so the final state depends on every rank's random stream: after a shrink or a grow each rank's must be the one a
cold resume on the new world gives it (docs/warm-restarts.md).
``--spare-after-step N``: a hot spare finishes its imports only once the group has trained step N (so a test
knows the job shrinks first and grows back later). ``--hold-for-grow A,B``: a shrunk group waits before its
step A until the agent has grown the job once (before B: twice), and ``--step-seconds`` makes the steps after
it long enough for the survivors to leave at a step boundary before the run ends. ``--hold-for-spare A``: the
group waits before its step A until a spare has finished its imports (``<run_dir>/spares/``: a node that
joined later has started its spare).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from goodput._env import RUN_DIR, WARM_ROLE
from goodput.bench._restart_train import Samples, collate, samples_log, write_final
from goodput.checkpoint import CheckpointConfig
from goodput.data import ResumableLoader
from goodput.run import Run

GLOBAL_BATCH = 12


def _trained_step(run_dir: str) -> int:
    try:
        with open(os.path.join(run_dir, "samples", "rank-0.jsonl")) as f:
            return max((json.loads(line)["step"] for line in f if line.endswith("\n")), default=0)
    except FileNotFoundError:
        return 0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=18)
    p.add_argument("--spare-after-step", type=int, default=0)
    p.add_argument("--hold-for-grow", default="")
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--hold-for-spare", type=int, default=0)
    args = p.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    run_dir = RUN_DIR.get()
    if WARM_ROLE.get() == "spare":
        os.makedirs(os.path.join(run_dir, "spares"), exist_ok=True)
        open(os.path.join(run_dir, "spares", str(os.getpid())), "w").close()  # imported
        while _trained_step(run_dir) < args.spare_after_step:
            time.sleep(0.05)  # this spare's imports "take" until the group has trained that far
    config = CheckpointConfig(root=os.path.join(run_dir, "checkpoints"), strategy="torch_save", every=1000)
    run = Run(
        run_dir, checkpoint=config, total_steps=args.steps, hang_timeout=60, progress=False, backend="gloo"
    )
    dataset = Samples(960, features=16, seed=7)
    holds = [int(step) for step in args.hold_for_grow.split(",") if step]
    run.warm(lambda r: _train(r, dataset, holds, args.step_seconds, args.hold_for_spare))


def _grows(run_dir: str) -> int:
    try:
        with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
            return sum('"grow"' in line for line in f)
    except FileNotFoundError:
        return 0


def _spare_imported(run_dir: str) -> bool:
    folder = os.path.join(run_dir, "spares")
    return os.path.isdir(folder) and bool(os.listdir(folder))


def _hold(run: Run, holds: list[int]) -> None:
    """Before a step of ``holds``, a shrunk group waits for the agent's next grow (the test's schedule)."""
    step = run.step + 1
    if step in holds and run.info.world_size < int(os.environ["GOODPUT_RESERVED_WORLD"]):
        while _grows(run.run_dir) <= holds.index(step):
            time.sleep(0.05)


def _train(run: Run, dataset: Samples, holds: list[int], step_seconds: float, spare_step: int) -> None:
    torch.manual_seed(0)
    inner = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)
    )
    model: torch.nn.Module = inner
    if run.info.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(inner)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.05 * s))
    loader = ResumableLoader(
        dataset, global_batch_size=GLOBAL_BATCH, seed=0, collate_fn=collate, drop_last=True
    )
    run.restore(model=model, optimizer=opt, scheduler=sched, loader=loader)
    with samples_log(run) as log:
        for ids, x in run.batches(loader):
            _hold(run, holds)
            while run.step + 1 == spare_step and not _spare_imported(run.run_dir):
                time.sleep(0.05)  # polling for a spare's mark
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            if step_seconds and holds and run.step >= holds[0]:
                time.sleep(step_seconds)
            record = {"step": run.step + 1, "samples": ids, "pid": os.getpid(), "world": run.info.world_size}
            log.write(json.dumps(record) + "\n")
            run.step_done(loss=float(loss.detach()))
    run.close()
    write_final(run, inner, opt)


if __name__ == "__main__":
    main()
