"""What ``Run`` does at the edges of a run: where its folder is, a run already complete, a preemption stop.

Kept apart from ``run.py`` so that the hot file only calls them.

* One run folder: ``goodput launch --run-dir`` exports ``$GOODPUT_RUN_DIR``; ``Run(run_dir)`` may repeat the
  same folder, but a different one is a ConfigError (one line; under ``goodput launch`` the job stops with
  ``EXIT_FATAL``): a drill launched into ``runs/drill`` must never resume ``runs/exp1`` behind the user's back.
* ``python train.py`` (no torchrun) is one rank: Run makes a one-process group on an in-memory store, so DDP,
  FSDP2 and DCP work unchanged, and the script can be debugged before it is launched.
* A run already complete (its restored step reaches ``total_steps``) trains nothing; rank 0 says so in one
  line, and the process goes on to ``close()`` and exits 0.
* A preemption stop saves the agreed step, waits until it is durable, records ``preempted`` in the ledger,
  reports the checkpoint to the launcher (or prints the line itself without one) and ends the process.
* ``run.warm(train)`` calls ``train(run)``: a ``train`` that cannot take the run is a ConfigError before any
  call (the TypeError of the call would fail every attempt in turn, a crash loop, instead of one line).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from goodput.errors import ConfigError
from goodput.launch.folder import PREEMPTED_FILE, launch_dir, write_marker

if TYPE_CHECKING:
    from goodput.run.run import Run

__all__ = ["already_complete", "check_train_fn", "resolve_run_dir", "single_process_group", "stop_preempted"]

RUN_DIR_ENV = "GOODPUT_RUN_DIR"


def resolve_run_dir(explicit: str | None) -> str:
    """The run folder: the launcher's (``$GOODPUT_RUN_DIR``) or ``explicit``; both must name the same one."""
    launched = os.environ.get(RUN_DIR_ENV) or None
    if explicit and launched and os.path.realpath(explicit) != os.path.realpath(launched):
        raise ConfigError(
            f"Run({explicit!r}) is not the run folder goodput launch --run-dir gave ({launched}): a run has "
            "one folder; pass the same one, or call Run() without a folder to use the launcher's"
        )
    run_dir = explicit or launched
    if not run_dir:
        raise ConfigError(
            f"Run needs a run folder: pass run_dir, or goodput launch --run-dir, or set {RUN_DIR_ENV}"
        )
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ConfigError(f"run folder {run_dir!r} is a file; pass a folder")
    return run_dir


def single_process_group(backend: str | None) -> bool:
    """Make a one-rank process group when none exists and none is expected; True if one was made."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return False
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return True


def already_complete(run: Run) -> bool:
    """True (and one line from rank 0) when the restored step already reaches ``total_steps``."""
    if run.total_steps is None or run.step < run.total_steps:
        return False
    if run.info.rank == 0:
        print(
            f"goodput: {run.run_dir} is already complete (step {run.step} of {run.total_steps}): nothing to "
            "train; use a new run folder to train again, or a larger total_steps to train on",
            file=sys.stderr,
            flush=True,
        )
    run.ledger.event("already_complete", step=run.step, total_steps=run.total_steps)
    return True


def stop_preempted(run: Run, why: str) -> None:
    """Save the current step durably on every rank, report it, close the run and end the process."""
    from goodput.launch.launcher import EXIT_PREEMPTED

    manager = run.manager
    if run._last_saved != run.step:
        run.save()
    with run._phase("checkpoint_save"):
        result = manager.wait()
    url = result.url if result is not None else (manager.results[-1].url if manager.results else None)
    run.ledger.event("preempted", step=run.step, signal=why, url=url)
    run._close("interrupted")
    if run.info.rank == 0:
        info = {"step": run.step, "url": url, "run_dir": run.run_dir, "signal": why}
        if not write_marker(PREEMPTED_FILE, info):
            print(
                f"goodput: preempted by {why}: saved step {run.step} to {url or run.run_dir}; run the same "
                f"command again to resume (exit {EXIT_PREEMPTED})",
                file=sys.stderr,
                flush=True,
            )
    raise SystemExit(0 if launch_dir() is not None else EXIT_PREEMPTED)


def check_train_fn(train_fn: Callable[..., Any]) -> None:
    """Refuse a ``train`` for ``run.warm`` that cannot be called as ``train(run)``.

    Raises:
        ConfigError: naming the function and the signature it needs.
    """
    try:
        inspect.signature(train_fn).bind(None)
    except TypeError:
        name = getattr(train_fn, "__name__", repr(train_fn))
        raise ConfigError(
            f"run.warm({name}) calls {name}(run), and again after each warm restart, but {name} takes "
            f"{inspect.signature(train_fn)}: define it as def {name}(run): ..."
        ) from None
    except ValueError:  # no signature to read (a builtin): the call itself decides
        return
