"""How ``goodput bench peers`` starts its torchft contender: torchft's lighthouse and one torchrun per replica group.

Kept apart from ``_peers_torchft.py`` (the training script), which imports torchft: the bench itself runs
without the ``peers`` extra and offers the contender only where torchft is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

__all__ = ["lighthouse", "peer_available", "torchft_group"]

_SCRIPT = os.path.join(os.path.dirname(__file__), "_peers_torchft.py")


def torchft_group(data: str, steps: int, group: int) -> list[str]:
    """One torchft replica group: a torchrun of one process that restarts only this group."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    every = max(1, steps // 20)  # each group's own save, at the baseline's cadence
    return [*cmd, "--max-restarts=50", _SCRIPT, f"--data={data}", f"--steps={steps}", f"--every={every}"]


def peer_available(module: str) -> bool:
    """Whether a peer's package (the ``peers`` extra: torchft, nvidia_resiliency_ext) can be imported here."""
    import importlib.util

    return importlib.util.find_spec(module) is not None


def lighthouse(log: Any) -> tuple[subprocess.Popen[bytes], str]:
    """torchft's lighthouse on a free loopback port, with the settings torchft's README starts it with."""
    import shutil
    import socket

    binary = shutil.which("torchft_lighthouse", path=os.path.dirname(sys.executable)) or shutil.which(
        "torchft_lighthouse"
    )
    if binary is None:
        raise RuntimeError("torchft_lighthouse not found: pip install 'goodput[peers]'")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = ["--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000"]
    proc = subprocess.Popen([binary, *flags, "--bind", f"127.0.0.1:{port}"], stdout=log, stderr=log)
    return proc, f"http://127.0.0.1:{port}"
