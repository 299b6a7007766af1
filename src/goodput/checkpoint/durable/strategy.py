"""The save-strategy contract: one Protocol, three implementations chosen by name.

A strategy writes the state of this rank into a folder and reads it back; it knows nothing about step folders,
manifests, retention or when to save (``layout.py`` and ``manager.py`` do). ``save`` returns after the part
that blocks training; the returned completion blocks until this rank's files are written and names them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from goodput.checkpoint.durable.layout import CheckpointLayout
from goodput.checkpoint.state import TrainingState

__all__ = ["STRATEGIES", "SaveContext", "SaveStrategy", "make_strategy"]

STRATEGIES = ("torch_save", "dcp", "dcp_async")

# Blocks until this rank's part of a save is written; returns the names of the files this rank wrote, or a
# mapping of each name to the "<algorithm>:<hex>" checksum computed while writing it (None: not computed).
Completion = Callable[[], list[str] | dict[str, str | None]]


@dataclass
class SaveContext:
    """What a strategy needs to know about where it runs."""

    layout: CheckpointLayout
    rank: int = 0
    world_size: int = 1
    group: Any = None  # the checkpoint's own gloo process group (None when not distributed)
    options: dict[str, Any] = field(default_factory=dict)


class SaveStrategy(Protocol):
    """How the bytes of a checkpoint are produced and read back."""

    name: str
    is_async: bool

    def save(self, state: TrainingState, folder: str, ctx: SaveContext) -> Completion:
        """Write ``state`` into ``folder``; return once training may go on (the state may then change)."""
        ...

    def load(self, state: TrainingState, folder: str, ctx: SaveContext) -> None:
        """Read a checkpoint written by this strategy from ``folder`` into ``state``."""
        ...

    def close(self) -> None:
        """Release buffers and helpers (after the last save completed)."""
        ...


def make_strategy(name: str, ctx: SaveContext) -> SaveStrategy:
    """The strategy called ``name`` (one of :data:`STRATEGIES`)."""
    if name == "torch_save":
        from goodput.checkpoint.durable.torch_save import TorchSaveStrategy

        return TorchSaveStrategy()
    if name == "dcp":
        from goodput.checkpoint.durable.dcp import DcpStrategy

        return DcpStrategy()
    if name == "dcp_async":
        from goodput.checkpoint.durable.dcp_async import DcpAsyncStrategy

        return DcpAsyncStrategy(checkpointer=ctx.options.get("async_checkpointer", "thread"))
    raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
