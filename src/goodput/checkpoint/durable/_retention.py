"""Retention: which committed checkpoints to remove, removed on a background thread after each commit (rank 0).

The newest committed checkpoint is never removed, nor the one a pin holds (the newest at or before the pinned
step: the numeric guard's rollback target). One part of the durable tier (``checkpointer.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from goodput.checkpoint.config import CheckpointConfig
from goodput.checkpoint.durable.layout import CheckpointLayout
from goodput.checkpoint.durable.manifest import CheckpointInfo
from goodput.faults import fault_point

__all__ = ["Retention", "to_purge"]

log = logging.getLogger("goodput.checkpoint.manager")  # the manager's logger: one name for its messages


class Retention:
    """Purges old checkpoints of ``layout`` in the background, one purge at a time.

    Args:
        config: ``keep_last`` and ``keep_every``.
        layout: the durable root.
        newest: the newest committed step (for the fault point a purge passes).
    """

    def __init__(
        self, config: CheckpointConfig, layout: CheckpointLayout, newest: Callable[[int], int]
    ) -> None:
        self.config = config
        self.layout = layout
        self._newest = newest
        self._purger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="goodput-purge")
        self._purge: Future[None] | None = None
        self.pinned: int | None = None  # keep the newest committed checkpoint at or before this step

    def schedule(self) -> None:
        """Queue a purge after this commit, unless one queued and not yet started will list it. A purge already
        running may have listed the root before this commit: the last commit of a run has no later one to purge
        after it, so another purge follows the running one."""
        queued = self._purge
        if queued is not None and not queued.running() and not queued.done():
            return
        self._purge = self._purger.submit(self._run_purge)

    def wait(self) -> None:
        """Wait for the purges in flight (the last one queued ends last): the folders they remove are gone when
        this returns."""
        if self._purge is not None:
            self._purge.result()

    def close(self) -> None:
        """Wait for the purge in flight and end the thread."""
        self.wait()
        self._purger.shutdown(wait=True)

    def _run_purge(self) -> None:
        try:
            if self._nothing_to_purge():
                return
            for info in to_purge(self.config, self.layout.scan(), pinned=self.pinned):
                fault_point("checkpoint_purge", self._newest(info.step))
                self.layout.remove(info)
        except Exception:
            log.exception("purging old checkpoints under %s failed; they stay", self.layout.root)

    def _nothing_to_purge(self) -> bool:
        """True when the root holds at most ``keep_last`` step folders: then no committed one can be purged, and
        one listing replaces reading every manifest (on an object store, a round trip each, on rank 0's
        connections to the server, while the next save may already be uploading)."""
        steps = [n for n in self.layout.list_files(self.layout.root) if n.startswith("step-")]
        return len(steps) <= self.config.keep_last


def to_purge(
    config: CheckpointConfig, rows: list[CheckpointInfo], *, pinned: int | None = None
) -> list[CheckpointInfo]:
    """Which committed checkpoints retention removes: all but the newest ``keep_last``, the ``keep_every``
    multiples and the newest at or before ``pinned``. The newest committed one is never among them."""
    committed = sorted((r for r in rows if r.status == "committed"), key=lambda r: r.step, reverse=True)
    anchor = next((r.step for r in committed if pinned is not None and r.step <= pinned), None)
    keep_every = config.keep_every
    return [
        r
        for i, r in enumerate(committed)
        if i >= config.keep_last and not (keep_every and r.step % keep_every == 0) and r.step != anchor
    ]
