"""A generation that ends before it forms (a rank failed while the group formed, e.g. just after a grow was
published): the ranks already waiting in it follow the agent to the next generation and form that one, in their
place there as survivors, instead of exiting, which the agent would take for one more failure (and shrink
again, until it ran out of restarts)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import textwrap

import torch.distributed as dist

from goodput.warm.protocol import Generation, arrived_key
from goodput.warm.record import record_folder, remove_folder
from goodput.warm.store import WarmStore

_RANK = textwrap.dedent(
    """
    import json
    import torch.distributed as dist
    from goodput.warm.worker import WarmWorker
    worker = WarmWorker()
    worker.join("gloo")
    print(json.dumps({"gen": worker.gen, "rank": dist.get_rank(), "world": dist.get_world_size()}))
    worker.stop_watch()
    dist.destroy_process_group()
    """
)


def test_a_rank_waiting_in_a_generation_that_ends_unformed_forms_its_successor() -> None:
    base = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
    )
    address = f"127.0.0.1:{base.port}"
    store = WarmStore(base)  # the agent's side, played here
    store.publish(Generation(gen=0, kind="cold", nodes={0: [0, 1]}))
    env = {
        **os.environ,
        "GOODPUT_WARM_STORE": address,
        "GOODPUT_WARM_ROLE": "worker",
        "GOODPUT_WARM_GEN": "0",
        "GOODPUT_WARM_REFORM_TIMEOUT": "60",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
    }
    rank = subprocess.Popen(
        [sys.executable, "-c", _RANK], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        base.wait([arrived_key(0)], datetime.timedelta(seconds=120))  # rank 1 waits in generation 0 ...
        # ... whose rank 0 died before it arrived: the agent ends generation 0 and shrinks to rank 1 alone
        successor = store.new_generation()
        assert store.end_generation(0, successor)
        store.publish(
            Generation(
                gen=successor, kind="shrink", failed=[0], from_gen=0, ranks={1: 0}, nodes={0: [0]},
                world_size=1, world_before=2,
            )
        )  # fmt: skip
        out, err = rank.communicate(timeout=120)
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
        remove_folder(record_folder(address, ""))
    assert rank.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1]) == {"gen": successor, "rank": 0, "world": 1}
