"""The one communication hook a DDP model takes, shared by every part of goodput that watches its buckets.

DDP accepts a single communication hook for a model's lifetime, and two parts of a run want one: the numeric
guard (a sum of each reduced bucket) and the straggler detector (when each bucket was ready and when its
all-reduce was done). :func:`add_tap` registers one hook per model, DDP's default all-reduce wrapped by
every *tap* added to it, in the order they were added (the first added is the outermost). A tap is called
with the bucket and a ``reduce()`` that runs the rest of the chain (the inner taps, then the all-reduce) and
returns its future; it returns that future or one chained to it. A part that attaches again (each restore, a
warm restart in the same process) replaces its own tap under its name.

A *rider* (:func:`set_rider`; the numeric guard's agreement) sends a few elements of its own with the first
bucket of each backward: they are all-reduced (summed) in the same collective as the gradients, appended to
the bucket's own storage (grown once to hold them after the gradients, so the bucket is divided in place as
DDP's default hook does and nothing is copied), so they cost no collective of their own.

A model's *pieces* (:func:`set_pieces`; goodput.run._ddp_buckets) cut a bucket into the buffers it is all-reduced
as: DDP's first backward in a process reduces one bucket of every gradient, which a resumed attempt would sum
otherwise than the uninterrupted run summed the same step in the buckets DDP had rebuilt since.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Pieces", "Rider", "Tap", "add_tap", "set_pieces", "set_rider"]

Tap = Callable[[Any, Callable[[], Any]], Any]
"""``tap(bucket, reduce) -> future``: wraps the bucket's all-reduce (``reduce()`` starts it)."""

Pieces = Callable[[Any], "list[list[int]] | None"]
"""``pieces(bucket)``: the buffers to all-reduce the bucket as, each a list of positions in
``bucket.gradients()`` in its order, the rider's payload with the first (None: the bucket as it is)."""


class Rider(Protocol):
    """Elements sent, summed over the ranks, with the first gradient bucket of a backward."""

    def payload(self, dtype: Any) -> Any:
        """The 1-D tensor of ``dtype`` to send with this bucket, as long at every backward (the length of a
        collective decides how the all-reduce sums the gradients in it), copied before the next call (it may be
        reused); None: nothing for this ``dtype``."""
        ...

    def departed(self, future: Any, summed: Any) -> None:
        """The all-reduce carrying the payload started; ``summed`` holds the sum once ``future`` is done."""
        ...


_HOOKS: weakref.WeakKeyDictionary[Any, _SharedHook] = weakref.WeakKeyDictionary()


class _SharedHook:
    """DDP's default all-reduce, wrapped by the taps of every part (outermost first)."""

    def __init__(self) -> None:
        self.taps: dict[str, Tap] = {}
        self.rider: Rider | None = None
        self.pieces: Pieces | None = None
        self._copy: Any = (
            None  # bucket 0's averaged copy with the rider's elements after it (storage can't grow)
        )
        self._grown_at = 0  # the data pointer of the bucket storage grown for the rider
        self._view: tuple[Any, Any] = (None, None)  # ((buffer's data pointer, length), the grown view of it)

    def function(self) -> Any:
        """The hook as DDP takes it: DDP refuses a ``bucket`` annotated other than ``dist.GradBucket``, which a
        postponed (string) annotation is, so the function it gets carries none."""

        def hook(group, bucket):  # type: ignore[no-untyped-def]
            return self._call(group, bucket, tuple(self.taps.values()), 0)

        return hook

    def _call(self, group: Any, bucket: Any, taps: tuple[Tap, ...], i: int) -> Any:
        if i == len(taps):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            rider = self.rider
            payload = rider.payload(bucket.buffer().dtype) if rider and bucket.index() == 0 else None
            pieces = self.pieces(bucket) if self.pieces is not None else None
            if pieces is not None:
                return _reduce_pieces(group, bucket, pieces, payload, rider)
            if payload is None:
                return allreduce_hook(group, bucket)
            assert rider is not None  # a payload comes from a rider
            return self._carry(group, bucket, payload, rider)
        return taps[i](bucket, lambda: self._call(group, bucket, taps, i + 1))

    def _carry(self, group: Any, bucket: Any, payload: Any, rider: Rider) -> Any:
        """DDP's default all-reduce of ``bucket`` (divided by the world size, then summed) with ``payload``
        after it in the same collective (summed, not divided); the future DDP gets holds the bucket's part
        alone."""
        import torch
        import torch.distributed as dist

        group = group if group is not None else dist.group.WORLD
        buffer = bucket.buffer()
        n, extra = buffer.numel(), payload.numel()
        carrier = self._grown(buffer, extra)
        if carrier is not None:  # the payload's room after the gradients: divided in place, as DDP's own hook
            carrier[:n].div_(group.size())
            reduced = buffer
        else:  # a storage that cannot grow: the bucket's averaged copy with the payload after it
            carrier = self._copy
            if carrier is None or carrier.numel() != n + extra or carrier.dtype != buffer.dtype:
                carrier = self._copy = torch.empty(n + extra, dtype=buffer.dtype, device=buffer.device)
            torch.div(buffer.view(-1), group.size(), out=carrier[:n])
            reduced = carrier[:n]
        carrier[n:].copy_(payload)
        future = dist.all_reduce(carrier, group=group, async_op=True).get_future()
        rider.departed(future, carrier[n:])

        def bucket_part(done: Any) -> Any:
            # value() raises the all-reduce's error (a peer that died mid-collective). Returning the bucket
            # without it would hand DDP this rank's own gradients as if summed: the optimizer would step on
            # them, and a warm restart would adopt that step.
            done.value()
            return reduced

        return future.then(bucket_part)

    def _grown(self, buffer: Any, extra: int) -> Any:
        """``buffer`` (a bucket's flat gradients) with ``extra`` elements after it in the same storage, grown
        once for them (None: the storage holds more than the bucket, or cannot grow). DDP's views of the
        bucket share the storage, so they see its new memory; a bucket DDP rebuilds has a new storage."""
        import torch

        # the kept view keeps its storage alive: a bucket DDP rebuilds has its buffer elsewhere
        if self._view[0] == (buffer.data_ptr(), buffer.numel() + extra):
            return self._view[1]
        offset, n, size = buffer.storage_offset(), buffer.numel(), buffer.element_size()
        storage = buffer.untyped_storage()
        needed = (offset + n + extra) * size
        if storage.nbytes() != needed or storage.data_ptr() != self._grown_at:
            if storage.nbytes() != (offset + n) * size:  # not the bucket's own, or grown by someone else
                return None
            try:
                storage.resize_(needed)
            except RuntimeError:
                return None
            self._grown_at = storage.data_ptr()
        view = torch.empty(0, dtype=buffer.dtype, device=buffer.device).set_(
            storage, offset, (n + extra,), (1,)
        )
        self._view = ((buffer.data_ptr(), n + extra), view)  # the buffer's pointer after the growth
        return view


def _reduce_pieces(group: Any, bucket: Any, pieces: list[list[int]], payload: Any, rider: Any) -> Any:
    """DDP's default all-reduce of ``bucket`` (divided by the world size, then summed) as one collective per
    piece, each gathering its gradients in its order, the first with ``payload`` after them; the future holds
    the bucket's buffer once every piece is summed and copied back."""
    import torch
    import torch.distributed as dist

    group = group if group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    sizes = [g.numel() for g in bucket.gradients()]
    offsets = [sum(sizes[:j]) for j in range(len(sizes))]
    assert sum(sizes) == buffer.numel(), "a bucket's gradients fill its buffer"
    views = [buffer[offsets[j] : offsets[j] + sizes[j]] for j in range(len(sizes))]
    flats, futures = [], []
    for k, piece in enumerate(pieces):
        extra = payload if k == 0 else None
        n = sum(sizes[j] for j in piece)
        flat = torch.empty(
            n + (0 if extra is None else extra.numel()), dtype=buffer.dtype, device=buffer.device
        )
        torch.cat([views[j] for j in piece], out=flat[:n])
        flat[:n].div_(group.size())
        if extra is not None:
            flat[n:].copy_(extra)
        future = dist.all_reduce(flat, group=group, async_op=True).get_future()
        if extra is not None:
            rider.departed(future, flat[n:])
        flats.append(flat)
        futures.append(future)

    def copied_back(done: Any) -> Any:
        for future in done.value():
            future.value()  # raises a piece's failed all-reduce (see _SharedHook._carry)
        for piece, flat in zip(pieces, flats, strict=True):
            at = 0
            for j in piece:
                views[j].copy_(flat[at : at + sizes[j]])
                at += sizes[j]
        return buffer

    return torch.futures.collect_all(futures).then(copied_back)


def _shared(model: Any) -> _SharedHook | None:
    """``model``'s shared hook, registered on first use (None: not DDP, or the user's own hook is there)."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return None
    shared = _HOOKS.get(model)
    if shared is None:
        shared = _SharedHook()
        try:
            model.register_comm_hook(model.process_group, shared.function())
        except RuntimeError:  # the user's own hook is there
            return None
        _HOOKS[model] = shared
    return shared


def add_tap(model: Any, name: str, tap: Tap) -> bool:
    """Wrap ``model``'s gradient all-reduces with ``tap`` (replacing the tap of that ``name``).

    Returns:
        False when ``model`` is not DDP or carries a communication hook of the user's (kept as it is).
    """
    shared = _shared(model)
    if shared is None:
        return False
    shared.taps[name] = tap
    return True


def set_pieces(model: Any, pieces: Pieces | None) -> bool:
    """All-reduce each bucket of ``model`` in the buffers ``pieces`` cuts it into (None: as it is).

    Returns:
        False when ``model`` is not DDP or carries a communication hook of the user's.
    """
    shared = _shared(model) if pieces is not None else _HOOKS.get(model)
    if shared is None:
        return False
    shared.pieces = pieces
    return True


def set_rider(model: Any, rider: Rider | None) -> bool:
    """Send ``rider``'s elements with the first bucket of each of ``model``'s backwards (None: stop).

    Returns:
        False when ``model`` carries no hook of ours (see :func:`add_tap`): nothing rides.
    """
    shared = _HOOKS.get(model)
    if shared is None:
        return False
    shared.rider = rider
    return True
