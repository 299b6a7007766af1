"""Checkpoints: the complete training state, three save strategies over DCP, atomic commit, retention, restore.

``CheckpointManager(CheckpointConfig(root=..., strategy=...), TrainingState(model=..., ...))`` is the entry point;
the other names are its parts (``CheckpointTier``: the protocol a tier of one's own implements).
"""

from __future__ import annotations

from goodput.checkpoint.config import ALLOW_FRESH_START_ENV, CheckpointConfig
from goodput.checkpoint.layout import MANIFEST_NAME, CheckpointLayout, list_checkpoints
from goodput.checkpoint.manager import CheckpointManager, SaveResult
from goodput.checkpoint.manifest import CheckpointInfo, FileEntry, Manifest
from goodput.checkpoint.memory.checkpointer import MemoryCheckpointer, MemoryRestore
from goodput.checkpoint.memory.listing import list_memory_checkpoints
from goodput.checkpoint.memory.store import MemoryStore, MemoryTier
from goodput.checkpoint.policy import AutoInterval, EveryInterval, EverySteps, SavePolicy
from goodput.checkpoint.rng import capture_rng, rank_seed, restore_rng, seed_new_rank
from goodput.checkpoint.state import LoaderState, TrainingState, check_shapes, tensor_shapes
from goodput.checkpoint.strategy import STRATEGIES, SaveContext, SaveStrategy, make_strategy
from goodput.checkpoint.tier import Cadence, CheckpointTier, Damage

__all__ = [
    "ALLOW_FRESH_START_ENV",
    "MANIFEST_NAME",
    "STRATEGIES",
    "AutoInterval",
    "Cadence",
    "CheckpointConfig",
    "CheckpointInfo",
    "CheckpointLayout",
    "CheckpointManager",
    "CheckpointTier",
    "Damage",
    "EveryInterval",
    "EverySteps",
    "FileEntry",
    "LoaderState",
    "Manifest",
    "MemoryCheckpointer",
    "MemoryRestore",
    "MemoryStore",
    "MemoryTier",
    "SaveContext",
    "SavePolicy",
    "SaveResult",
    "SaveStrategy",
    "TrainingState",
    "capture_rng",
    "check_shapes",
    "list_checkpoints",
    "list_memory_checkpoints",
    "make_strategy",
    "rank_seed",
    "restore_rng",
    "seed_new_rank",
    "tensor_shapes",
]
