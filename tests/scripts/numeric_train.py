"""A README-style loop for the numeric guard's tests: DDP (or FSDP2) over a tiny model, memory tier and DCP.

goodput launch --nproc 2 --run-dir DIR [--faults 'nan@step=5,rank=1'] -- tests/scripts/numeric_train.py
    [--steps 24] [--every 4] [--memory-every 2] [--check-every 4] [--poison I] [--fsdp] [--workers 2] [--no-guard]

--poison I: sample I of the dataset is NaN (a fault in the data: it comes back on every redo of its step).
--no-guard: the README's ``Run`` (the numeric guard off, as a user who never heard of it writes it).
Each rank appends ``{"attempt", "step", "indices", "loss"}`` per step to ``DIR/samples-rank-R.jsonl`` (the test
takes the last line of each step as the one kept) and writes ``DIR/final-rank-R.json`` (step, a parameter hash).
"""

import argparse
import hashlib
import json
import os

import torch

import goodput as gp

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=24)
p.add_argument("--every", type=int, default=4)
p.add_argument("--memory-every", type=int, default=2)
p.add_argument("--check-every", type=int, default=4)
p.add_argument("--poison", type=int, default=None)
p.add_argument("--fsdp", action="store_true")
p.add_argument("--workers", type=int, default=0)
p.add_argument("--no-guard", action="store_true")
args = p.parse_args()

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
run_dir = os.environ["GOODPUT_RUN_DIR"]
config = gp.CheckpointConfig(
    root=os.path.join(run_dir, "checkpoints"),
    strategy="dcp",
    every=args.every,
    memory=gp.MemoryTier(every=args.memory_every, keep=2, folder=os.path.join(run_dir, "ram")),
)
numeric = gp.NumericConfig(check_every=args.check_every, spike_warmup=4, spike_window=20)
run = gp.Run(
    total_steps=args.steps, checkpoint=config, hang_timeout=120, progress=False, backend="gloo",
    numeric=False if args.no_guard else numeric,
)  # fmt: skip


class Data(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> torch.Tensor:
        row = torch.arange(4, dtype=torch.float32) / 4 + index / 256
        return torch.full((4,), float("nan")) if index == args.poison else row


net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
if args.fsdp:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (run.info.world_size,))
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    model: torch.nn.Module = fully_shard(net, mesh=mesh)
else:
    model = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = gp.ResumableLoader(Data(), batch_size=2, seed=0, drop_last=True, num_workers=args.workers)
run.restore(model=model, optimizer=opt, loader=loader)
rank = run.info.rank
log = open(os.path.join(run_dir, f"samples-rank-{rank}.jsonl"), "a")  # noqa: SIM115
for batch in run.batches(loader):
    # + 1: a part no model can fit, as a real loss has (the data's entropy); without it this toy's loss
    # falls towards 0 and varies by factors from step to step, which a spike must exceed
    loss = model(batch).pow(2).mean() + 1.0
    loss.backward()
    opt.step()
    opt.zero_grad()
    indices = [int(i) for i in loader.last_indices]
    log.write(json.dumps({"attempt": run.attempt, "step": run.step + 1, "indices": indices}) + "\n")
    log.flush()
    run.step_done(loss=loss.item())
run.close()
digest = hashlib.sha256()
for tensor in model.state_dict().values():
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    digest.update(local.detach().numpy().tobytes())
with open(os.path.join(run_dir, f"final-rank-{rank}.json"), "w") as f:
    json.dump({"step": run.step, "params": digest.hexdigest()}, f)
