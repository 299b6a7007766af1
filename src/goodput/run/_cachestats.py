"""The data cache into the ledger: ``cache_config`` (its folder, budget and usage) once per attempt, and its
counters as ``cache_stats`` at each epoch's end and when the run closes.

The counters are node-wide (every process reading through the cache folder, DataLoader workers included) and
kept across attempts, so one rank per node records them (local rank 0), as differences from what the cache
had counted when this attempt began. The report then shows them (``report.json``'s ``cache_stats``) and its
advice knows the run reads through the cache; ``goodput drill --soak`` reads ``cache_config`` to check the
folder against its budget while the job runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from goodput.ledger.ledger import Ledger

__all__ = ["CacheStatsRecorder"]


class CacheStatsRecorder:
    """Records the cache counters of ``loader``'s dataset (a ``ShardedDataset`` or ``FolderDataset`` with a
    cache) into ``ledger``; does nothing for a dataset without a cache, or off local rank 0."""

    def __init__(self, ledger: Ledger, loader: Any) -> None:
        self._ledger = ledger
        dataset = getattr(loader, "dataset", None)
        metrics, usage = getattr(dataset, "cache_metrics", None), getattr(dataset, "cache_usage", None)
        first = int(os.environ.get("LOCAL_RANK", "0")) == 0
        self._metrics: Callable[[], dict[str, float]] | None = (
            metrics if callable(metrics) and first else None
        )
        self._usage: Callable[[], dict[str, Any]] | None = usage if callable(usage) and first else None
        self._baseline = self._read()
        self._last: dict[str, float] | None = None
        self.epoch = 0  # the epoch being read (set by Run when it starts one)

    def _read(self) -> dict[str, float]:
        return dict(self._metrics()) if self._metrics is not None else {}

    def declare(self) -> None:
        """Record where the cache is, its budget and its usage now (``cache_config``) in this attempt."""
        found = self._usage() if self._usage is not None else {}
        if found:
            self._ledger.cache_config(
                folder=str(found["folder"]),
                budget_bytes=int(found["budget_bytes"]),
                usage_bytes=int(found["usage_bytes"]),
            )

    def follow(self, ledger: Ledger) -> None:
        """Record into ``ledger`` from now on, counting from now (a new attempt in this process)."""
        self._ledger = ledger
        self._baseline = self._read()
        self._last = None

    def record(self) -> None:
        """The counters since this attempt began, as of now: the end of ``epoch``, or the close of the run
        within it (the ledger keeps the epoch's share)."""
        now = self._read()
        if not now or now == self._last:  # no cache, or nothing read since the last record
            return
        self._last = now
        counters = {name: value - self._baseline.get(name, 0.0) for name, value in now.items()}
        self._ledger.cache_stats(self.epoch, counters)
