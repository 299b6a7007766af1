"""How ``goodput bench peers`` gets torchtitan for its ``titan`` contender: installed on first use, apart.

torchtitan 0.3.0 pins ``datasets<4.8`` (and tensorboard, wandb, tokenizers, ...), none of which its checkpoint,
optimizer and data-loader modules import, and the dev install's ``datasets`` is newer: so it is installed with
``--no-deps``, beside the few small packages those modules do import, into a cache folder of its own that only
the contender's processes put on their path. ``import goodput`` never imports torchtitan.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

__all__ = ["TORCHTITAN", "titan_folder", "titan_site"]

TORCHTITAN = (
    "torchtitan==0.3.0",
    "tyro==1.0.17",  # torchtitan.config imports it; it imports the next two
    "docstring-parser==0.18.0",
    "typeguard==4.6.1",
    "spmd-types==0.2.3",  # torchtitan.distributed, which the optimizer container imports
)
_OFFLINE_FAST = ("--retries", "1", "--timeout", "20")  # an unreachable index fails in seconds, not minutes
_CHECK = (
    "from torchtitan.components.checkpoint import CheckpointManager\n"
    "from torchtitan.components.dataloader import ParallelAwareDataloader\n"
    "from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer\n"
)


def titan_folder() -> str:
    """Where the bench keeps torchtitan: ``$XDG_CACHE_HOME/goodput/torchtitan-0.3.0`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "goodput", "torchtitan-0.3.0")


def titan_site(folder: str | None = None) -> str:
    """The folder torchtitan imports from, installed there first if it is not yet.

    Raises:
        RuntimeError: it cannot be installed (no package index reachable, say), or does not import once it is.
    """
    folder = folder or titan_folder()
    if os.path.isdir(folder):  # renamed into place only once installed and imported
        return folder
    print(f"installing torchtitan 0.3.0 into {folder} (first use of the titan contender)", file=sys.stderr)
    staging = f"{folder}.tmp-{os.getpid()}"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *_OFFLINE_FAST]
    try:
        _run([*pip, "--target", staging, *TORCHTITAN], "pip install")
        _run([sys.executable, "-c", _CHECK], "import", env=dict(os.environ, PYTHONPATH=staging))
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        if not os.path.isdir(folder):  # another bench may have installed it meanwhile
            os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()] or ["no output"]
        raise RuntimeError(
            f"torchtitan 0.3.0 could not be installed: {what} exited {done.returncode}: {lines[-1]}"
        )
