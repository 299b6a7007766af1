"""Launching the demo training for ``goodput verify-resume`` and the chaos tests: data, fault plans, runs."""

from __future__ import annotations

import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from goodput.demo.main import TRAIN_SCRIPT
from goodput.errors import ConfigError
from goodput.launch.launcher import LaunchConfig, launch_job

__all__ = ["fault_plan", "prepare_data", "train", "train_two_nodes"]


CORPUS_BYTES = 512 * 2**10
SHARD_BYTES = 64 * 2**10


def prepare_data(work: str) -> str:
    """Write a small demo corpus under ``work`` once; returns its URL."""
    from goodput.demo.prepare import write_corpus

    url = os.path.join(work, "data")
    if not os.path.exists(os.path.join(url, "index.json")):
        write_corpus(url, limit=CORPUS_BYTES, shard_bytes=SHARD_BYTES)
    return url


def fault_plan(
    kills: int,
    *,
    steps: int,
    every: int,
    nproc: int,
    seed: int,
    memory: bool = False,
    node_loss: bool = False,
) -> str:
    """``kills`` SIGKILLs at seeded random points: plain steps, and inside checkpoint writes, async uploads,
    purges and restores (one each, when there are enough kills); with ``memory``, first inside memory-tier
    writes and restores (and, with ``node_loss``, replication). ``node_loss`` adds the loss of node 1 (every
    process of it killed, its memory tier wiped) at a random step after the first durable save."""
    rng = np.random.default_rng(seed)
    phases = ["checkpoint_write", "async_upload", "restore", "checkpoint_purge"]
    if memory:
        phases = ["memory_write", "checkpoint_write", "memory_restore", *(["memory_replicate"] * node_loss),
                  "async_upload", "restore", "checkpoint_purge"]  # fmt: skip
    faults = []
    for n in range(kills):
        rank = int(rng.integers(nproc))
        if n % 2 == 1 and phases:
            phase = phases.pop(0)
            if phase in ("restore", "memory_restore"):
                faults.append(f"kill@phase={phase},rank={rank},attempt={n}")
                continue
            step = int(rng.integers(every, steps - every))
            if phase == "checkpoint_purge":
                rank = 0  # rank 0 purges
            faults.append(f"kill@phase={phase},step={step},rank={rank}")
        else:
            faults.append(f"kill@step={int(rng.integers(1, steps))},rank={rank}")
    if node_loss:
        faults.append(f"nodeloss@step={int(rng.integers(every + 1, steps))},node=1")
    return "; ".join(faults)


def _local_port() -> int:
    """A free TCP port on 127.0.0.1 (for the two agents' c10d rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train_two_nodes(run_dir: str, *, nproc: int, **settings: Any) -> int:
    """:func:`train` as a job of two torchrun agents on this machine (``--nnodes 2``, c10d rendezvous on
    127.0.0.1), ``nproc // 2`` ranks each; returns the first non-zero exit status of the two, else 0."""
    if nproc < 2 or nproc % 2:
        raise ConfigError(f"two nodes need an even number of ranks (--nproc), got {nproc}")
    node: dict[str, Any] = {"nproc": nproc // 2, "nnodes": 2, "rdzv_endpoint": f"127.0.0.1:{_local_port()}"}
    with ThreadPoolExecutor(2, thread_name_prefix="goodput-node") as pool:
        statuses = [f.result() for f in [pool.submit(train, run_dir, **node, **settings) for _ in range(2)]]
    return next((s for s in statuses if s != 0), 0)


def train(
    run_dir: str,
    *,
    data: str,
    nproc: int,
    steps: int,
    every: int,
    strategy: str,
    seed: int,
    faults: str,
    max_restarts: int,
    hang_timeout: float = 120.0,
    nnodes: int = 1,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
    memory_every: str = "off",
    memory_folder: str | None = None,
    restart: str = "cold",
) -> int:
    """Run the demo training under torchrun (``goodput launch``); returns its exit status.

    With ``nnodes > 1`` this launches one node of the job (call it once per node, concurrently).
    ``memory_every``: the memory tier's cadence (``"off"``: none); its folder defaults to ``<run_dir>/shm``.
    ``restart``: ``"cold"`` (torchrun restarts the group) or ``"warm"`` (the warm-restart agent, one spare).
    """
    script = (
        TRAIN_SCRIPT,
        f"--data={data}",
        f"--steps={steps}",
        f"--every={every}",
        f"--strategy={strategy}",
        f"--seed={seed}",
        "--workers=1",  # worker-side augmentation
        "--no-progress",
        f"--hang-timeout={hang_timeout}",
        f"--memory-every={memory_every}",
        f"--memory-folder={memory_folder or os.path.join(run_dir, 'shm')}",
    )
    config = LaunchConfig(
        script=script,
        nproc=nproc,
        nnodes=str(nnodes),
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id="goodput-verify",
        max_restarts=max_restarts,
        run_dir=run_dir,
        faults=faults,
        crash_loop=4,
        verbose=True,  # the caller keeps all of it in output.log
    )
    if restart == "warm":
        from goodput.warm.agent import WarmConfig, launch_warm

        return launch_warm(config, WarmConfig(spares=1))
    return launch_job(config)
