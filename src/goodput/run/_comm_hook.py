"""The one communication hook a DDP model takes, shared by every part of goodput that watches its buckets.

DDP accepts a single communication hook for a model's lifetime, and two parts of a run want one: the numeric
guard (a sum of each reduced bucket) and the straggler detector (when each bucket was ready and when its
all-reduce was done). :func:`add_tap` registers one hook per model, DDP's default all-reduce wrapped by
every *tap* added to it, in the order they were added (the first added is the outermost). A tap is called
with the bucket and a ``reduce()`` that runs the rest of the chain (the inner taps, then the all-reduce) and
returns its future; it returns that future or one chained to it. A part that attaches again (each restore, a
warm restart in the same process) replaces its own tap under its name.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["Tap", "add_tap"]

Tap = Callable[[Any, Callable[[], Any]], Any]
"""``tap(bucket, reduce) -> future``: wraps the bucket's all-reduce (``reduce()`` starts it)."""

_HOOKS: weakref.WeakKeyDictionary[Any, _SharedHook] = weakref.WeakKeyDictionary()


class _SharedHook:
    """DDP's default all-reduce, wrapped by the taps of every part (outermost first)."""

    def __init__(self) -> None:
        self.taps: dict[str, Tap] = {}

    def function(self) -> Any:
        """The hook as DDP takes it: DDP refuses a ``bucket`` annotated other than ``dist.GradBucket``, which a
        postponed (string) annotation is, so the function it gets carries none."""

        def hook(group, bucket):  # type: ignore[no-untyped-def]
            return self._call(group, bucket, tuple(self.taps.values()), 0)

        return hook

    def _call(self, group: Any, bucket: Any, taps: tuple[Tap, ...], i: int) -> Any:
        if i == len(taps):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            return allreduce_hook(group, bucket)
        return taps[i](bucket, lambda: self._call(group, bucket, taps, i + 1))


def add_tap(model: Any, name: str, tap: Tap) -> bool:
    """Wrap ``model``'s gradient all-reduces with ``tap`` (replacing the tap of that ``name``).

    Returns:
        False when ``model`` is not DDP or carries a communication hook of the user's (kept as it is).
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return False
    shared = _HOOKS.get(model)
    if shared is None:
        shared = _SharedHook()
        try:
            model.register_comm_hook(model.process_group, shared.function())
        except RuntimeError:  # the user's own hook is there
            return False
        _HOOKS[model] = shared
    shared.taps[name] = tap
    return True
