"""Retention for ``CheckpointManager``: which committed checkpoints to remove, removed on a background thread
after each commit (rank 0). The newest committed checkpoint is never removed.

A mixin of ``CheckpointManager`` (see ``manager.py``), kept apart so each file holds one part of the manager.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

from goodput.checkpoint.config import CheckpointConfig
from goodput.checkpoint.layout import CheckpointLayout
from goodput.checkpoint.manifest import CheckpointInfo
from goodput.faults import fault_point

__all__: list[str] = []

log = logging.getLogger("goodput.checkpoint.manager")  # the manager's logger, as before the split


class _Retention:
    """``CheckpointManager``'s retention (the attributes below are set by its ``__init__``)."""

    config: CheckpointConfig
    _layout: CheckpointLayout
    _committed: set[int]
    _purger: ThreadPoolExecutor
    _purge: Future[None] | None

    def _schedule_purge(self) -> None:
        if self._purge is not None and not self._purge.done():
            return  # the running purge will see this commit next time
        self._purge = self._purger.submit(self._run_purge)

    def _run_purge(self) -> None:
        try:
            if self._nothing_to_purge():
                return
            for info in self.to_purge(self._layout.scan()):
                fault_point("checkpoint_purge", max(self._committed, default=info.step))
                self._layout.remove(info)
        except Exception:
            log.exception("purging old checkpoints under %s failed; they stay", self._layout.root)

    def _nothing_to_purge(self) -> bool:
        """True when the root holds at most ``keep_last`` step folders: then no committed one can be purged, and
        one listing replaces reading every manifest (on an object store, a round trip each, on rank 0's
        connections to the server, while the next save may already be uploading)."""
        steps = [n for n in self._layout.list_files(self._layout.root) if n.startswith("step-")]
        return len(steps) <= self.config.keep_last

    def to_purge(self, rows: list[CheckpointInfo]) -> list[CheckpointInfo]:
        """Which committed checkpoints retention removes: all but the newest ``keep_last`` and the
        ``keep_every`` multiples. The newest committed one is never among them."""
        committed = sorted((r for r in rows if r.status == "committed"), key=lambda r: r.step, reverse=True)
        keep_every = self.config.keep_every
        return [
            r
            for i, r in enumerate(committed)
            if i >= self.config.keep_last and not (keep_every and r.step % keep_every == 0)
        ]
