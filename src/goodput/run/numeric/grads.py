"""The numeric guard's gradient check: is any gradient NaN or infinite before the optimizer step?

Two ways, the cheaper where it applies:

* **A DDP model**: a communication hook keeps each gradient bucket's all-reduce, and the optimizer's pre-step
  hook sums the reduced buckets (:class:`BucketCheck`): one sum per bucket, added on their device and read once
  per step (no callback per bucket on the collective's thread). The reduced gradients are the same on every
  rank, so every rank reaches the same answer with no collective of its own, and a NaN made by one rank's
  backward reaches every rank's sum through the all-reduce. A bucket is one flat buffer: one reduction per
  bucket instead of one per parameter.
* **Anything else** (FSDP2's local shards, a plain module, a DDP model whose user registered a hook of their
  own): the sum of every gradient this rank holds (:func:`gradient_sum`).

Either way the sum is NaN or infinite exactly when an element is (a NaN propagates; an Inf stays infinite or
meets the opposite Inf as NaN); a sum can overflow only past float32's 3.4e38, which counts as non-finite too.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

from goodput.run._comm_hook import add_tap, set_rider
from goodput.run.numeric.carry import Carrier

__all__ = ["BucketCheck"]

# A DDP model accepts one communication hook for its lifetime: the guard of each restore (a warm restart
# attaches again) re-binds the check already registered on it.
_REGISTERED: weakref.WeakKeyDictionary[Any, BucketCheck] = weakref.WeakKeyDictionary()


class BucketCheck:
    """A tap of DDP's communication hook: keeps each bucket's all-reduce until :meth:`take` sums the reduced
    buckets of the step. It also carries the guard's agreement (``carrier``, see ``carry``).

    ``poison``: set by a drill's ``nan@...,into=grad`` fault on its rank; the next bucket is made non-finite
    before its all-reduce, as a rank whose backward produced a NaN would send it.
    """

    def __init__(self) -> None:
        self._reduced: list[Any] = []
        self.poison: float | None = None
        self.carrier: Carrier | None = None

    @classmethod
    def install(cls, model: Any, group: Any) -> BucketCheck | None:
        """The check registered on ``model`` (a DDP module), registering it on first use; None when ``model``
        is not DDP or already carries another hook. ``group``: the guard's own group (None: one rank), for
        the words the carrier could not send; the carrier is set when DDP's group is the whole job."""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            return None
        check = _REGISTERED.get(model)
        if check is None:
            check = cls()
            # one hook per DDP model, shared with the straggler detector (goodput.run._comm_hook)
            if not add_tap(model, "numeric", check._hook):  # the user's own hook: the pass over the gradients
                return None
            _REGISTERED[model] = check
        check._reduced.clear()
        check.poison = None
        ddp_group = model.process_group
        whole = group is not None and dist.get_world_size(ddp_group) == dist.get_world_size()
        check.carrier = Carrier(dist.get_rank(), dist.get_world_size(), group) if whole else None
        set_rider(model, check.carrier)
        return check

    def arm(self, faults: Any, step: int) -> None:
        """A drill's ``nan@step,into=grad`` (``faults``: the run's plan) for ``step``'s backward goes into this
        rank's first bucket before its all-reduce, as a NaN from this rank's own backward would."""
        fault = faults.take("nan", step, into="grad")
        self.poison = None if fault is None else (math.nan if fault.value == "nan" else math.inf)

    def _hook(self, bucket: Any, reduce: Any) -> Any:
        """A tap of the model's shared hook: poison the bucket when armed, keep its all-reduce."""
        if self.poison is not None:
            bucket.buffer().view(-1)[0] = self.poison
            self.poison = None
        future = reduce()
        self._reduced.append(future)
        return future

    def drop(self) -> bool:
        """Forget the buckets reduced since the last call, unread (a step the guard does not check): whether
        there were any."""
        futures, self._reduced = self._reduced, []
        return bool(futures)

    def take(self) -> float | None:
        """The total of the buckets reduced since the last call (None: no bucket was reduced, e.g. under
        ``no_sync``). DDP waited for every bucket before the backward returned: their values are there."""

        futures, self._reduced = self._reduced, []
        if not futures:
            return None
        total = futures[0].value().sum()
        for future in futures[1:]:
            total += future.value().sum()
        return float(total.item())
