"""A worker's start with Python's cyclic garbage collector held back until its first step.

``python -m goodput.warm.boot SCRIPT ARGS...`` (how the warm-restart agent starts workers and spares) raises the
collector's thresholds, then runs SCRIPT as ``__main__`` (``runpy``, as ``python SCRIPT`` would). Importing torch,
``torch._dynamo`` (which every torch.optim optimizer imports when it is built) and sympy allocates ~500k objects
that live as long as the process: with the default thresholds the collector scans them again and again while they
are made, a large share of a spare's start-up CPU.
The collector still runs, only less often, so a script that never reaches ``Run`` leaks nothing.

:func:`release`, called by ``Run`` once its set-up is done (before the first step), puts the thresholds back and
moves every object made so far to the permanent generation (``gc.freeze``): later full collections skip them, and
forked data-loader workers do not copy their pages by touching their reference counts' neighbours.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys

__all__ = ["HELD_THRESHOLDS", "collect_failed", "hold", "main", "release"]

HELD_THRESHOLDS = (50_000, 50, 1_000)  # gen0 every 50k allocations (default 700); gen2 rarely

_saved: tuple[int, int, int] | None = None


def hold() -> None:
    """Raise the collector's thresholds (remembering the current ones for :func:`release`)."""
    global _saved
    if _saved is None:
        _saved = gc.get_threshold()
        gc.set_threshold(*HELD_THRESHOLDS)


def release() -> None:
    """Put the thresholds back and freeze what exists; does nothing unless :func:`hold` ran in this process."""
    global _saved
    if _saved is not None:
        gc.set_threshold(*_saved)
        _saved = None
        gc.freeze()


def collect_failed() -> None:
    """Collect the objects a failed generation left in this surviving process, now.

    Its DDP wrapper, optimizer and checkpoint manager hold its process groups, and they are in reference
    cycles, which only a full collection frees: with the many long-lived objects of a trained process that
    comes rarely, and until then each group's gloo threads and sockets stay open, more with every warm
    restart. Call it once the failed generation's objects are unreachable (the next generation's restore);
    its connections are hung up by then (``goodput.warm.hangup``), so no group's destructor waits on one.
    """
    gc.collect()


def main(argv: list[str]) -> None:
    """Run the script ``argv[0]`` with arguments ``argv[1:]`` as ``__main__``, the collector held back."""
    hold()
    from goodput.job.signals import end_with_launcher  # no torch here

    end_with_launcher()  # under goodput launch: a SIGKILLed launcher takes torchrun, and torchrun this worker
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as ``python SCRIPT`` has it (not the cwd of -m)
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    # Run as ``python -m``, this module is ``__main__``: hold and release must act on the one that Run imports.
    from goodput.warm.boot import main as _main

    _main(sys.argv[1:])
