"""The save-strategy contract: one Protocol, three implementations chosen by name.

A strategy writes the state of this rank into a folder and reads it back; it knows nothing about step folders,
manifests, retention or when to save (``layout.py`` and ``manager.py`` do). ``save`` returns after the part
that blocks training; the returned completion blocks until this rank's files are written and names them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from goodput.checkpoint.layout import CheckpointLayout
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
        from goodput.checkpoint.torch_save import TorchSaveStrategy

        return TorchSaveStrategy()
    if name in ("dcp", "dcp_async"):
        return _Deferred(name, ctx)
    raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")


class _Deferred:
    """A DCP strategy built at its first use, so that a process imports DCP only when it saves or restores (see
    :mod:`goodput.checkpoint._prewarm`); ``close`` of one never used imports nothing."""

    def __init__(self, name: str, ctx: SaveContext) -> None:
        self.name = name
        self._checkpointer = ctx.options.get("async_checkpointer", "thread")
        self._strategy: Any = None

    @property
    def module(self) -> str:
        """The strategy's module (imported by the background prewarm too)."""
        return f"goodput.checkpoint.{self.name}"

    def resolve(self) -> SaveStrategy:
        """The real strategy (imports DCP on first call, after any running prewarm)."""
        if self._strategy is None:
            from goodput.checkpoint._prewarm import settle

            settle()
            if self.name == "dcp":
                from goodput.checkpoint.dcp import DcpStrategy

                self._strategy = DcpStrategy()
            else:
                from goodput.checkpoint.dcp_async import DcpAsyncStrategy

                self._strategy = DcpAsyncStrategy(checkpointer=self._checkpointer)
        return self._strategy

    def __getattr__(self, attr: str) -> Any:  # is_async, save, load, writes_later, ...: the real strategy's
        if attr.startswith("__") or attr in ("_strategy", "_checkpointer", "name"):
            raise AttributeError(attr)
        return getattr(self.resolve(), attr)

    def close(self) -> None:
        if self._strategy is not None:
            self._strategy.close()
