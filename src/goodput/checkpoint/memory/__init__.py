"""The memory tier: checkpoints in node-local RAM with a peer copy, restored in about a step.

``store`` holds the tier's folders, ``checkpointer`` saves and restores through them, ``format`` and ``read``
are the on-RAM layout, ``replica`` the peer copy, ``setup`` wires a tier to a manager, ``huge_pages`` the
allocation behind it.
"""

from goodput.checkpoint.memory.store import MemoryStore, MemoryTier

__all__ = ["MemoryStore", "MemoryTier"]
