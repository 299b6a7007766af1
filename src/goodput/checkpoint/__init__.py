"""Checkpoints: the complete training state, three save strategies over DCP, atomic commit, retention, restore.

``CheckpointManager(CheckpointConfig(root=..., strategy=...), TrainingState(model=..., ...))`` is the entry point;
the other names are its parts (``CheckpointTier``: the protocol a tier of one's own implements).
"""

from __future__ import annotations

from goodput.checkpoint.config import CheckpointConfig
from goodput.checkpoint.durable.layout import list_checkpoints
from goodput.checkpoint.manager import CheckpointManager
from goodput.checkpoint.memory.store import MemoryTier
from goodput.checkpoint.policy import AutoInterval
from goodput.checkpoint.rng import rank_seed
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.tier import Cadence, CheckpointTier, Damage

__all__ = [
    "AutoInterval",
    "Cadence",
    "CheckpointConfig",
    "CheckpointManager",
    "CheckpointTier",
    "Damage",
    "MemoryTier",
    "TrainingState",
    "list_checkpoints",
    "rank_seed",
]
