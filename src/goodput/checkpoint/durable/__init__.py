"""The durable tier: step folders under the checkpoint root, written by a save strategy, committed atomically,
kept by retention, and restored newest valid first.

``checkpointer`` composes the tier (:class:`DurableCheckpointer`) from its parts: ``strategy`` (the Protocol)
with ``torch_save``, ``dcp`` and ``dcp_async`` (over ``staging``), ``layout`` (the root's folders, commit and
listing), ``manifest`` (what a committed checkpoint records), ``hashing`` (checksums while writing and
reading), ``objectstore`` (remote roots, with ``_part_upload``), ``_retention`` and ``_restoring``.

Names (see ``tier.py``): ``*Tier`` is a configuration a user writes (``MemoryTier``), ``*Checkpointer`` the
tier that implements :class:`~goodput.checkpoint.CheckpointTier`. The durable tier has no ``DurableTier``:
every run has it, and its options are :class:`~goodput.checkpoint.CheckpointConfig`'s own (``root``,
``strategy``, ``every``, ``keep_last``, ...).

The names below are imported on first use: the parts (``layout``, ``manifest``) are read by the manager, the
memory tier and ``goodput ls`` without pulling in the whole tier, and the tier imports the checkpoint config,
which imports ``strategy`` from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from goodput._lazy import lazy_names

__all__ = ["DurableCheckpointer", "StagedSource"]

if TYPE_CHECKING:
    from goodput.checkpoint.durable.checkpointer import DurableCheckpointer, StagedSource
else:
    __getattr__, __dir__ = lazy_names(
        __name__, dict.fromkeys(__all__, "goodput.checkpoint.durable.checkpointer"), globals(), __all__
    )
