"""The shared "interrupt, snapshot, restore, compare" check for anything with state_dict()/load_state_dict().

Usage (a data loader; a checkpointed model works the same way with its own ``steps``)::

    interrupt_snapshot_restore_compare(make_loader, iter, interrupt_at=3)

1. a reference run: ``steps(make())`` to the end (or ``limit`` items);
2. an interrupted run: a fresh component runs ``interrupt_at`` items, its state is snapshotted (round-tripped
   through JSON by default, as a checkpoint would store it) and the rest of the run is recorded;
3. a restored run: another fresh component loads the snapshot and runs to the end.

It asserts that the interrupted run matched the reference, and that the restored run yields exactly what the
interrupted run still had to yield. Items are compared with ``same`` (tensors by value, recursively).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

C = TypeVar("C")


def same(a: Any, b: Any) -> bool:
    """Deep equality where tensors compare by dtype, shape and value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def interrupt_snapshot_restore_compare(
    make: Callable[[], C],
    steps: Callable[[C], Iterable[Any]],
    interrupt_at: int,
    *,
    limit: int | None = None,
    snapshot: Callable[[C], Any] = lambda c: c.state_dict(),  # type: ignore[attr-defined]
    restore: Callable[[C, Any], None] = lambda c, s: c.load_state_dict(s),  # type: ignore[attr-defined]
    json_round_trip: bool = True,
) -> tuple[list[Any], list[Any]]:
    """Run, interrupt after ``interrupt_at`` items, snapshot, restore into a fresh component, compare.

    Returns:
        (items before the interruption, items after it) of the interrupted run, for further assertions.
    """
    reference = list(itertools.islice(steps(make()), limit))

    interrupted = make()
    run = iter(steps(interrupted))
    before = list(itertools.islice(run, interrupt_at))
    state = snapshot(interrupted)
    if json_round_trip:
        state = json.loads(json.dumps(state))
    rest_limit = None if limit is None else limit - len(before)
    rest = list(itertools.islice(run, rest_limit))
    assert same(before + rest, reference), "the interrupted run differs from an uninterrupted one"

    restored = make()
    restore(restored, state)
    after = list(itertools.islice(steps(restored), rest_limit))
    assert len(after) == len(rest), f"restored run yielded {len(after)} items, expected {len(rest)}"
    assert same(after, rest), "the restored run differs from the rest of the interrupted run"
    return before, rest
