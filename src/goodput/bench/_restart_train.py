"""A small DDP training written as a warm-restartable function, for ``goodput bench restart`` and the tests.

    goodput launch --restart warm --nproc 2 --run-dir runs/w -- src/goodput/bench/_restart_train.py --steps 60

The model has dropout (so every rank draws from its RNG each step), AdamW and an LR schedule; the data are
seeded synthetic samples through ``ResumableLoader``. Every rank logs the sample ids of each step it trains
(``<run_dir>/samples/rank-<r>.jsonl``), and rank 0 writes ``<run_dir>/final.json`` with hashes of the final model
and optimizer state, so two runs can be compared bit for bit (``tests/scripts/shrink_train.py`` shares these
parts). ``--step-seconds`` adds a fixed sleep to each
step (a stand-in for a bigger model, so restart costs can be compared with step time). ``--device cuda`` trains
on each rank's own GPU over NCCL (the GPU-only warm tests); the default is the CPU over gloo, whatever the
machine has.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from typing import IO

import torch

from goodput._env import RUN_DIR
from goodput.checkpoint import CheckpointConfig
from goodput.data import ResumableLoader
from goodput.demo.train import tensor_hash
from goodput.errors import ConfigError
from goodput.run import Run
from goodput.run.numeric import NumericConfig


class Samples(torch.utils.data.Dataset[tuple[int, torch.Tensor]]):
    """Deterministic synthetic samples: (id, ``features`` values) from a generator seeded with ``seed``."""

    def __init__(self, n: int = 4096, features: int = 32, seed: int = 1234) -> None:
        self.x = torch.randn(n, features, generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, self.x[i]


def collate(items: list[tuple[int, torch.Tensor]]) -> tuple[list[int], torch.Tensor]:
    """Sample ids and a (batch, features) tensor."""
    return [i for i, _ in items], torch.stack([t for _, t in items])


def samples_log(run: Run) -> IO[str]:
    """This rank's log of the sample ids it trains at each step, opened to append (one JSON object a line)."""
    os.makedirs(os.path.join(run.run_dir, "samples"), exist_ok=True)
    return open(os.path.join(run.run_dir, "samples", f"rank-{run.info.rank}.jsonl"), "a", buffering=1)


def write_final(run: Run, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """On rank 0, ``<run_dir>/final.json``: the last step and hashes of the final model and optimizer state."""
    if run.info.rank != 0:
        return
    final = {
        "step": run.step,
        "model": tensor_hash(model.state_dict()),
        "optim": tensor_hash(opt.state_dict()["state"]),
    }
    with open(os.path.join(run.run_dir, "final.json"), "w") as f:
        json.dump(final, f)


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    p.add_argument("--strategy", default="torch_save")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2 instead of DDP")
    p.add_argument("--hang-timeout", type=float, default=60.0)
    p.add_argument(
        "--global-batch", type=int, default=0, help="samples per step over all ranks (default: 8 per rank)"
    )
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    p.add_argument("--fail-at-step", type=int, default=0, help="rank 1 raises before this step, every time")
    p.add_argument("--fatal-at-step", type=int, default=0, help="rank 1 raises ConfigError before this step")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: each rank's GPU, over NCCL"
    )
    p.add_argument(
        "--die-mid-step",
        type=int,
        default=0,
        help="rank 1 SIGKILLs itself after this step's backward, before its optimizer step (first process only)",
    )
    p.add_argument(
        "--check-every",
        type=int,
        default=None,
        help="turn the numeric guard on with this replica check interval (default: the guard is off, as in Run)",
    )
    p.add_argument(
        "--die-after-optimizer",
        type=int,
        default=0,
        help="rank 1 SIGKILLs itself after this step's optimizer step, before step_done (first process only)",
    )
    p.add_argument(
        "--log-resources",
        action="store_true",
        help="also log this process's open files and threads at each step (the samples log's fds, threads)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    if args.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    run_dir = RUN_DIR.get()
    config = CheckpointConfig(
        root=os.path.join(run_dir, "checkpoints"), strategy=args.strategy, every=args.every, keep_last=2
    )
    run = Run(
        run_dir,
        checkpoint=config,
        total_steps=args.steps,
        hang_timeout=args.hang_timeout,
        progress=False,
        backend="nccl" if args.device == "cuda" else "gloo",
        numeric=NumericConfig(check_every=args.check_every) if args.check_every else False,
    )
    dataset = Samples()  # built once: a survivor reuses it after a warm restart
    run.warm(lambda r: _train(r, args, dataset))


def _train(run: Run, args: argparse.Namespace, dataset: Samples) -> None:
    """One entry of the training function: everything bound to the process group is built here."""
    torch.manual_seed(0)
    inner = torch.nn.Sequential(
        torch.nn.Linear(32, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Dropout(args.dropout),
        torch.nn.Linear(args.hidden, 1),
    )
    device = (
        torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    )
    inner.to(device)
    model: torch.nn.Module = inner
    if args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(inner, mesh=init_device_mesh(device.type, (run.info.world_size,)))
    elif run.info.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(inner)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.01 * s))
    batch = {"global_batch_size": args.global_batch} if args.global_batch else {"batch_size": 8}
    loader = ResumableLoader(
        dataset, **batch, seed=0, collate_fn=collate, drop_last=True, num_workers=args.workers
    )
    run.restore(model=model, optimizer=opt, scheduler=sched, loader=loader)
    with samples_log(run) as log:
        for ids, x in run.batches(loader):
            _broken(run, args)
            x = x.to(device)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            loss.backward()
            _die_mid_step(run, args.die_mid_step)
            opt.step()
            _die_mid_step(run, args.die_after_optimizer)
            opt.zero_grad(set_to_none=True)
            sched.step()
            if args.step_seconds:
                time.sleep(args.step_seconds)
            record = {
                "step": run.step + 1,
                "samples": ids,
                "pid": os.getpid(),
                "live": run.ledger.live_totals(),
            }
            if args.log_resources:
                record.update(
                    fds=len(os.listdir("/proc/self/fd")), threads=len(os.listdir("/proc/self/task"))
                )
            log.write(json.dumps(record) + "\n")
            run.step_done(loss=float(loss.detach()))
    run.close()
    if not args.fsdp:  # (sharded tensors would need a gather to hash)
        write_final(run, inner, opt)


def _die_mid_step(run: Run, at_step: int) -> None:
    """Rank 1's SIGKILL inside step ``at_step``, after its gradients' all-reduce (not at a step boundary)."""
    if run.info.rank != 1 or run.step + 1 != at_step:
        return
    marker = os.path.join(run.run_dir, "died-mid-step")
    if os.path.exists(marker):  # the replacement redoes this step
        return
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)


def _broken(run: Run, args: argparse.Namespace) -> None:
    """The tests' failures that a restart does not cure: a crash loop, an error a restart cannot fix."""
    if run.info.rank != 1:
        return
    if run.step + 1 == args.fail_at_step:
        raise RuntimeError(f"bad batch at step {args.fail_at_step}")
    if run.step + 1 == args.fatal_at_step:
        raise ConfigError(f"--fatal-at-step {args.fatal_at_step}: a configuration no restart can fix")


if __name__ == "__main__":
    main()
