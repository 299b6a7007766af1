"""A data-parallel "training" job over every in-place format at once, for the 2 -> 1 -> 2 SIGKILL test
(spawned processes import it).

Each rank joins a gloo group, restores the position rank 0 saved last (the state is the same on every rank),
and runs steps over ``tests._formats.Together`` (sample ``i`` of every format): receive a batch, log its ids
per format, all-reduce (the lockstep), and rank 0 saves the position. ``kill_at`` SIGKILLs the last rank at
that step, after it received its batch and before the all-reduce, as a machine failure would: no rank saves it.
"""

from __future__ import annotations

import json
import os
import signal

from tests.helpers.data_ranks import join_gloo, save_json

N, BATCH, SEED = 96, 4, 7
POSITION = "position.json"


def train(
    rank: int, world: int, port: int, workdir: str, urls: dict[str, str], attempt: int, kill_at: int | None
) -> None:
    import torch
    import torch.distributed as dist

    from goodput import ResumableLoader
    from tests.helpers.formats import Together

    join_gloo(rank, world, port)
    loader = ResumableLoader(
        Together(urls),
        batch_size=BATCH,
        seed=SEED,
        num_workers=1,
        multiprocessing_context="fork",
        collate_fn=list,
    )
    step = 0
    position = os.path.join(workdir, POSITION)
    if os.path.exists(position):
        with open(position) as f:
            saved = json.load(f)
        loader.load_state_dict(saved["loader"])
        step = saved["step"]
    with open(os.path.join(workdir, f"samples-attempt{attempt}-rank{rank}.jsonl"), "a") as log:
        for batch in loader:
            ids = {name: [sample[name] for sample in batch] for name in urls}
            log.write(json.dumps({"attempt": attempt, "step": step, "ids": ids}) + "\n")
            log.flush()
            if rank == world - 1 and step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(torch.tensor(float(len(batch))))  # the training step keeps the ranks in lockstep
            step += 1
            if rank == 0:
                save_json(position, {"step": step, "loader": loader.state_dict()})
    dist.destroy_process_group()
