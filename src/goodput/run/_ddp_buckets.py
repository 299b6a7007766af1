"""One gradient-bucket layout for a DDP model at every step, so a resumed attempt sums as the first did.

DDP (``find_unused_parameters=False`` or ``static_graph=True``) starts with one bucket of every parameter and,
after the first backward of each process (the second with ``static_graph``), rebuilds its buckets in the order
the gradients became ready. An attempt resumed at step N therefore trains step N+1 with the first layout, where
the uninterrupted run trained it with the rebuilt one. The element offsets differ, so the all-reduce cuts the
buffer into different chunks; with three ranks or more the sum of some elements is taken in another order and
differs in the last bits (two ranks sum ``a + b``, the same either way).

:func:`fix_layout` gives every attempt one layout from its first step, in one of two ways:

* A model whose parameters fit DDP's first bucket: its buckets are rebuilt once at restore, before any step, in
  registration order; DDP then never rebuilds them. One bucket either way, so no overlap of communication with
  the backward is lost.
* A larger model keeps DDP's own rebuild, which orders the buckets so that the first all-reduces start while
  the backward still runs. Until DDP has rebuilt them, goodput's communication hook (``_comm_hook``) all-reduces
  the one first bucket as the buckets DDP is about to build: from the order this backward's gradients became
  ready, cut by DDP's bucket sizes, one collective each. Every step of every attempt then sums as the rebuilt
  layout does. A model with a communication hook of the user's keeps DDP's first layout at its first step.
"""

from __future__ import annotations

import weakref
from typing import Any

from goodput.run._comm_hook import set_pieces

__all__ = ["fix_layout"]


def fix_layout(model: Any) -> bool:
    """Give the DDP ``model`` one bucket layout for every step, on every rank (a collective: each rank calls it).

    Returns:
        True when the buckets were rebuilt or the first ones will be reduced as the rebuilt ones; False when
        ``model`` is not DDP, its buckets never change (``find_unused_parameters=True``), it rebuilt them
        already, it has the user's own list of bucket sizes, or it carries a communication hook of the user's
        and holds more than one bucket.
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return False
    if model.find_unused_parameters and not model.static_graph:
        return False  # DDP keeps its first layout for good
    if getattr(model, "_has_rebuilt_buckets", False):
        return False
    limits = _rebuild_limits(model)
    if limits is None:
        return False  # the user's own bucket sizes: DDP's layouts as they are
    size = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if size > limits[0]:
        return _ReadyOrder.install(model, limits)
    model.reducer._push_all_rebuilt_params()
    rebuilt = bool(model.reducer._rebuild_buckets())  # sends rank 0's bucket indices to every rank
    model._has_rebuilt_buckets = rebuilt
    return rebuilt


def _rebuild_limits(model: Any) -> list[int] | None:
    """The byte limits DDP rebuilds ``model``'s buckets with: the first bucket's, then every other's (None: the
    user's own list of bucket sizes, which DDP uses from the first step)."""
    import torch.distributed as dist

    config = getattr(model, "_bucket_config", None)
    if config is not None and config.has_custom_per_bucket_caps:
        return None
    cap = int(model.bucket_bytes_cap)
    first = (
        config.first_bucket_bytes_cap if config is not None else min(dist._DEFAULT_FIRST_BUCKET_BYTES, cap)
    )
    return [int(first), cap]


_ORDERS: weakref.WeakKeyDictionary[Any, _ReadyOrder] = weakref.WeakKeyDictionary()


class _ReadyOrder:
    """The order a DDP model's gradients became ready in its latest backward, and the buckets DDP rebuilds from
    it (:meth:`pieces`, the shared hook's cut of the first bucket)."""

    def __init__(self, model: Any, limits: list[int]) -> None:
        self._model = weakref.ref(model)
        self._limits = limits
        self._ready: list[Any] = []
        params = [p for p in model.parameters() if p.requires_grad]
        self._handles = [p.register_post_accumulate_grad_hook(self._ready.append) for p in params]
        self._handles.append(model.register_forward_pre_hook(lambda *_: self._ready.clear()))

    @classmethod
    def install(cls, model: Any, limits: list[int]) -> bool:
        """Record ``model``'s ready order and cut its first bucket by it (replacing an earlier restore's)."""
        old = _ORDERS.pop(model, None)
        if old is not None:
            old.remove()
        order = cls(model, limits)
        if not set_pieces(model, order.pieces):  # the user's own hook
            order.remove()
            return False
        _ORDERS[model] = order
        return True

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def pieces(self, bucket: Any) -> list[list[int]] | None:
        """The rebuilt buckets as positions in ``bucket``, while it is DDP's one first bucket (None after)."""
        import torch.distributed as dist

        model = self._model()
        if model is None or getattr(model, "_has_rebuilt_buckets", False):
            self.remove()
            if model is not None:
                set_pieces(model, None)
            return None
        params = bucket.parameters()
        position = {id(p): j for j, p in enumerate(params)}
        ready = [position[id(p)] for p in self._ready if id(p) in position]
        if not (bucket.index() == 0 and bucket.is_last()) or sorted(ready) != list(range(len(params))):
            return None  # not one bucket of every gradient, each ready once: DDP's own all-reduce
        ordered = [params[j] for j in ready]
        buckets, _ = dist._compute_bucket_assignment_by_size(
            ordered, self._limits, [False] * len(ordered), list(range(len(ordered)))
        )
        return [[ready[i] for i in b] for b in buckets]
