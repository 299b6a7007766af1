"""A torchrun worker for launch tests: joins the group, and dies by SIGKILL in the first attempts.

goodput launch --nproc 2 --max-restarts 3 --run-dir DIR -- tests/scripts/restart_worker.py KILLS
"""

import json
import os
import signal
import sys

import torch
import torch.distributed as dist

from goodput.distributed import init_distributed

kills = int(sys.argv[1])
info = init_distributed("gloo")
total = torch.tensor([float(info.rank + 1)])
dist.all_reduce(total)
run_dir = os.environ["GOODPUT_RUN_DIR"]
if info.attempt < kills and info.rank == info.attempt % info.world_size:
    os.kill(os.getpid(), signal.SIGKILL)
dist.barrier()
with open(os.path.join(run_dir, f"done-rank{info.rank}.json"), "w") as f:
    json.dump({"attempt": info.attempt, "sum": total.item(), "world": info.world_size}, f)
dist.destroy_process_group()
