"""Real multi-process gloo groups on CPU for tests: spawn N ranks, run a function in each, collect results.

Each rank is a real OS process joined to a gloo process group on a fresh 127.0.0.1 port; the results are returned
in rank order. A rank that raises fails the whole call with its traceback; every process is joined before
returning.

The ranks are forked from a multiprocessing forkserver that imported torch once (``_PRELOAD``): a fresh process
per rank, as with the spawn start method, without each one paying torch's imports again. The forkserver's
environment is the one it started with, so each rank takes the caller's current environment as it starts.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

from goodput._env import TESTING_BREAK_MESH

__all__ = ["run_ranks"]

# Imported once by the forkserver, which every rank is forked from; torch only: a module that reads the
# environment as it is imported would otherwise keep the forkserver's.
_PRELOAD = ["torch", "torch.distributed", "torch.distributed.checkpoint"]

# A rank whose gloo group could not form: gloo's full mesh between the ranks of one call can fail at
# ``init_process_group`` ("Gloo connectFullMesh failed ... Connection closed by peer") for a cause not known.
# Every rank passes a barrier on the new group before it starts the rank function, so when one rank's mesh
# fails no rank has started it, and the call is made once more from the start, in a new folder.
_MESH_FAILED = "group not formed"
BREAK_MESH_ENV = TESTING_BREAK_MESH.name


def _entry(
    rank: int,
    fn: Callable[..., Any],
    world: int,
    port: int,
    out_dir: str,
    args: tuple[Any, ...],
    environ: dict[str, str],
) -> None:
    import faulthandler

    import torch.distributed as dist

    faulthandler.enable(all_threads=True)  # a rank killed by a signal (an abort in C++) prints its stacks
    os.environ.clear()  # the caller's environment now, not the one the forkserver started with
    os.environ.update(environ)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    result: tuple[str, Any]
    # A file store in the call's own folder, not a TCP store on the port (the port stays in the environment
    # for the rank function).
    store = f"file://{os.path.join(out_dir, 'store')}"
    try:
        _break_mesh_once(rank)
        dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
        # No rank starts fn before every rank's mesh is up: a rank whose mesh failed leaves the others waiting
        # here, not in fn, so that the call may be made again without fn having run anywhere.
        dist.barrier()
    except BaseException:
        result = (_MESH_FAILED, traceback.format_exc())  # fn never ran on this rank
    else:
        open(os.path.join(out_dir, f"rank{rank}.began"), "w").close()
        try:
            result = ("ok", fn(rank, world, *args))
        except BaseException:
            result = ("error", traceback.format_exc())
        finally:
            if dist.is_initialized():  # a rank function may end the group itself (to make its own)
                dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    # Leave without the interpreter's teardown. A gloo worker thread still finishing a collective when
    # finalization begins aborts the process ("terminate called without an active exception"; see
    # goodput.checkpoint._groups). CheckpointManager.close now ends its own groups' threads, but a rank function
    # may end right after a collective on a group nobody can end before exit (the default group, which FSDP/DDP
    # modules hold): the rank's result is written by now, and its exit status must not depend on that race.
    # destroy_process_group() and a gc.collect() do not close it: a rank that ran an FSDP job keeps C++ threads
    # past them. A user's process takes the ordinary exit: tests/checkpoint/test_teardown.py.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if result[0] == "ok" else 1)


def _break_mesh_once(rank: int) -> None:
    """For the harness's own test: rank 0 fails to form the group when ``BREAK_MESH_ENV`` names a file that
    exists, and removes it (so the call's second try forms it)."""
    marker = os.environ.get(BREAK_MESH_ENV)
    if rank == 0 and marker and os.path.exists(marker):
        os.remove(marker)
        raise RuntimeError("the group's mesh was broken on purpose (BREAK_MESH_ENV)")


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` gloo-connected processes; results by rank.

    ``fn`` and ``args`` must be picklable (a module-level function). Raises RuntimeError with the failing
    rank's traceback if any rank fails. When the group did not form on some rank, so that no rank started
    ``fn``, every rank is started once more (see ``_MESH_FAILED``); ``fn`` never runs twice on a rank.
    """
    import torch.multiprocessing as mp

    mp.get_context("forkserver").set_forkserver_preload(_PRELOAD)  # read when the forkserver starts
    for tries_left in (1, 0):
        with tempfile.TemporaryDirectory(prefix="goodput-ranks-") as out_dir:
            try:
                return _run_once(mp, fn, world_size, args, out_dir, timeout)
            except RuntimeError as err:
                began = any(
                    os.path.exists(os.path.join(out_dir, f"rank{r}.began")) for r in range(world_size)
                )
                if began or not tries_left:
                    raise
                print(f"run_ranks: the group did not form; forming it once more:\n{err}", file=sys.stderr)
    raise AssertionError("unreachable")


def _run_once(
    mp: Any, fn: Callable[..., Any], world_size: int, args: Any, out_dir: str, timeout: float
) -> list:
    from goodput.testing.seaweed import free_port

    ctx = mp.start_processes(
        _entry,
        args=(fn, world_size, free_port(), out_dir, args, dict(os.environ)),
        nprocs=world_size,
        join=False,
        start_method="forkserver",
    )
    try:
        while not ctx.join(timeout=timeout):
            pass
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
        raise RuntimeError(_collect_errors(out_dir, world_size) or str(err)) from None
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
                proc.join()
    results = []
    for rank in range(world_size):
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "rb") as f:
            _status, value = pickle.load(f)  # our own children's output, written just now
        results.append(value)
    return results


def _collect_errors(out_dir: str, world_size: int) -> str:
    messages = []
    for rank in range(world_size):
        path = os.path.join(out_dir, f"rank{rank}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as f:
                status, value = pickle.load(f)
            if status != "ok":
                messages.append(f"rank {rank} failed:\n{value}")
    return "\n".join(messages)
