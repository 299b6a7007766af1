"""One gradient-bucket layout for a DDP model from its first step, so a resumed attempt sums as the first did.

DDP (``find_unused_parameters=False`` or ``static_graph=True``) starts with one bucket of every parameter in
reverse registration order and, after the first backward of each process, rebuilds its buckets in the order the
gradients became ready. An attempt resumed at step N therefore trains step N+1 with the first layout, where the
uninterrupted run trained it with the rebuilt one. The element offsets differ, so the all-reduce cuts the
buffer into different chunks; with three ranks or more the sum of some elements is taken in another order and
differs in the last bits (two ranks sum ``a + b``, the same either way).

:func:`fix_layout` rebuilds the buckets once at restore, before any step, in registration order; DDP then never
rebuilds them, and every attempt uses the same layout at every step. Buckets in registration order hold the
first layers' gradients in bucket 0, which DDP reduces first and whose gradients are ready last: a model of
several buckets would start none of its all-reduces before its backward ends, so it would lose DDP's overlap of
communication with the backward. The layout is fixed only for a model whose parameters fit DDP's first bucket
(one bucket either way: nothing to overlap); a larger model keeps DDP's own rebuild and its overlap
(docs/launch.md says where bitwise identity holds).
"""

from __future__ import annotations

from typing import Any

__all__ = ["fix_layout"]


def fix_layout(model: Any) -> bool:
    """Give the DDP ``model`` its final bucket layout now, on every rank (a collective: each rank calls it).

    Returns:
        True when the buckets were rebuilt; False when ``model`` is not DDP, its buckets never change
        (``find_unused_parameters=True``), it rebuilt them already, or it holds more than one bucket.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return False
    if model.find_unused_parameters and not model.static_graph:
        return False  # DDP keeps its first layout for good
    if getattr(model, "_has_rebuilt_buckets", False):
        return False
    size = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    first = min(getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1024 * 1024), int(model.bucket_bytes_cap))
    if size > first:
        return False  # several buckets: fixing them in registration order costs the overlap
    model.reducer._push_all_rebuilt_params()
    rebuilt = bool(model.reducer._rebuild_buckets())  # sends rank 0's bucket indices to every rank
    model._has_rebuilt_buckets = rebuilt
    return rebuilt
