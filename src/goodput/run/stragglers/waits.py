"""How long a rank waited for the others in one step, from the hooks its model's parallelism offers.

- **DDP**: a tap on the model's communication hook (:mod:`goodput.run._comm_hook`, shared with the numeric
  guard) notes when each gradient bucket is ready and when its all-reduce is done; the wait is from the last
  bucket being ready to its all-reduce being done, which ends only once the slowest rank's bucket is ready.
- **FSDP2** (``fully_shard``): its public ``set_custom_all_gather`` / ``set_custom_reduce_scatter`` take the
  communication FSDP2 calls; a wrapper around the one in place times each call, and the wait is the step's
  time inside them: a rank that finished its own work early blocks in the next all-gather or reduce-scatter
  until the slowest rank reaches it. Times are host-side: exact for blocking CPU collectives (gloo); where the
  collective returns at once (an async op, CUDA streams) the wait lands in the rank's compute instead.

The step's compute is then the rest of its time (:class:`goodput.run.stragglers.StragglerMonitor`).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.nn.parallel import DistributedDataParallel

from goodput.run._comm_hook import add_tap

__all__ = ["WaitClock", "attach_clock"]


class WaitClock(Protocol):
    """This step's wait for the other ranks (seconds), reset when a batch is handed to the loop."""

    def reset(self) -> None: ...

    def wait(self) -> float: ...


class BucketClock:
    """DDP: when this step's gradient buckets were ready and their all-reduces done (perf_counter seconds)."""

    def __init__(self) -> None:
        self.ready = 0.0
        self.done = 0.0

    def reset(self) -> None:
        self.ready = self.done = 0.0

    def wait(self) -> float:
        return max(0.0, self.done - self.ready) if self.ready > 0.0 else 0.0

    def tap(self, bucket: Any, reduce: Any) -> Any:
        """This bucket is ready now; its all-reduce is done when the future is (value passed on unchanged)."""
        self.ready = time.perf_counter()
        return reduce().then(self._done)

    def _done(self, future: Any) -> Any:
        self.done = time.perf_counter()
        return future.value()


class CollectiveClock:
    """FSDP2: the step's seconds inside its all-gathers and reduce-scatters."""

    def __init__(self) -> None:
        self.total = 0.0

    def reset(self) -> None:
        self.total = 0.0

    def wait(self) -> float:
        return self.total


class _Timed:
    """A communication FSDP2 calls, wrapped so that the step's seconds inside it add up in ``clock``."""

    def __init__(self, inner: Any, clock: CollectiveClock) -> None:
        self.inner, self.clock = inner, clock

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def _timed(self, *args: Any) -> dist.Work | None:
        start = time.perf_counter()
        try:
            return self.inner(*args)
        finally:
            self.clock.total += time.perf_counter() - start


class _TimedAllGather(_Timed, AllGather):
    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> dist.Work | None:
        return self._timed(output_tensor, input_tensor, group, async_op)


class _TimedReduceScatter(_Timed, ReduceScatter):
    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        return self._timed(output_tensor, input_tensor, group, op, async_op)


def _time_fsdp(model: torch.nn.Module, clock: CollectiveClock) -> bool:
    """Wrap the communication of every FSDP2 module in ``model`` (False: none could be wrapped)."""
    wrapped = False
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        # FSDP2 offers setters, not getters: the comm in place (the default or the user's) is read from its
        # parameter group so that a custom one is kept, only timed.
        groups = getattr(module._get_fsdp_state(), "_fsdp_param_groups", [])
        if len(groups) != 1:  # none (no parameters), or several (the setters refuse them)
            continue
        group = groups[0]
        gather, scatter = group._all_gather_comm, group._reduce_scatter_comm
        if not isinstance(gather, _TimedAllGather):
            module.set_custom_all_gather(_TimedAllGather(gather, clock))
        else:
            gather.clock = clock
        if not isinstance(scatter, _TimedReduceScatter):
            module.set_custom_reduce_scatter(_TimedReduceScatter(scatter, clock))
        else:
            scatter.clock = clock
        wrapped = True
    return wrapped


def attach_clock(model: Any) -> WaitClock | None:
    """The wait clock for ``model``: DDP, or a module holding FSDP2 modules; None for any other model, or a DDP model with a
    communication hook of the user's (nothing then tells this rank's own work from its waits)."""
    if isinstance(model, torch.nn.Module) and not isinstance(model, DistributedDataParallel):
        fsdp = CollectiveClock()
        return fsdp if _time_fsdp(model, fsdp) else None
    ddp = BucketClock()
    return ddp if add_tap(model, "stragglers", ddp.tap) else None
