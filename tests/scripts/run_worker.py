"""A training script written like the README's loop (DDP over a tiny model), for launch and preemption tests.

goodput launch --nproc 2 --run-dir DIR -- tests/scripts/run_worker.py [--steps N] [--step-seconds S]
    [--strategy dcp_async] [--every 1000] [--broken FILE] [--run-dir DIR] [--workers N] [--say]
python tests/scripts/run_worker.py --run-dir DIR        (one rank, no torchrun)

--broken FILE: while FILE exists, every attempt raises right after restoring (a crash loop until it is fixed).
--fatal: raise a ConfigError after restoring (a restart cannot fix it).
--raise-at STEP [--raise-rank R]: raise "ValueError: bad batch at step STEP" in that step, in every attempt (on
    rank R only; default every rank). --changing step|message: the first 3 attempts' errors differ (in step
    STEP + attempt, or with the attempt in the message), later attempts train to the end.
--say: rank 0 prints "worker says: step N" (stdout) and logs "worker logs: step N" (stderr) at every step.
"""

import argparse
import logging
import os
import time

import torch

import goodput as gp
from goodput.errors import ConfigError

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--step-seconds", type=float, default=0.0)
p.add_argument("--strategy", default="dcp")
p.add_argument("--every", type=int, default=1000)
p.add_argument("--broken", default=None)
p.add_argument("--fatal", action="store_true")
p.add_argument("--run-dir", default=None)
p.add_argument("--hang-timeout", type=float, default=120.0)
p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
p.add_argument("--say", action="store_true")
p.add_argument("--raise-at", type=int, default=None)
p.add_argument("--raise-rank", type=int, default=None)
p.add_argument("--changing", choices=("step", "message"), default=None)
args = p.parse_args()


def failure(step: int) -> str | None:
    """The error this rank raises in ``step`` (``--raise-at``), or None."""
    if args.raise_at is None or args.raise_rank not in (None, run.info.rank):
        return None
    at, note = args.raise_at, ""
    if args.changing is not None:
        if run.attempt >= 3:
            return None
        at += run.attempt if args.changing == "step" else 0
        note = f" (attempt {run.attempt})" if args.changing == "message" else ""
    return f"bad batch at step {at}{note}" if step == at else None


torch.manual_seed(0)
run = gp.Run(  # a CPU model: gloo, also on a machine with GPUs
    args.run_dir, total_steps=args.steps, hang_timeout=args.hang_timeout, progress=False, backend="gloo"
)
run.config = gp.CheckpointConfig(  # under the run folder, wherever it came from
    root=os.path.join(run.run_dir, "checkpoints"), strategy=args.strategy, every=args.every
)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4) / 256
loader = gp.ResumableLoader(data, batch_size=2, seed=0, drop_last=True, num_workers=args.workers)
start = run.restore(model=model, optimizer=opt, loader=loader)
if args.broken and os.path.exists(args.broken):
    raise RuntimeError(f"broken input: {args.broken} exists")
if args.fatal:
    raise ConfigError("the learning rate schedule needs warmup_steps < total_steps")
for batch in run.batches(loader):
    loss = model(batch).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    error = failure(run.step + 1)
    if error is not None:
        raise ValueError(error)
    if args.step_seconds:
        time.sleep(args.step_seconds)  # a step that takes this long (the job's pace, not a synchronisation)
    run.step_done(loss=loss.item())
    if args.say and run.info.rank == 0:
        print(f"worker says: step {run.step}", flush=True)
        logging.getLogger("worker").warning("worker logs: step %d", run.step)
    if run.step == 3 and run.info.rank == 0:
        with open(os.path.join(run.run_dir, "training"), "w") as f:
            f.write(str(os.getpid()))  # tests wait for this before signalling
run.close()
if run.info.rank == 0:
    with open(os.path.join(run.run_dir, "finished"), "w") as f:
        f.write(str(run.step))
