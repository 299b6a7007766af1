"""``CheckpointConfig``: everything a user chooses about checkpoints, validated when it is made."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from goodput._env import ALLOW_FRESH_START
from goodput.checkpoint.durable.strategy import STRATEGIES
from goodput.checkpoint.memory.store import MemoryTier
from goodput.errors import ConfigError
from goodput.units import parse_duration

__all__ = ["ALLOW_FRESH_START_ENV", "CheckpointConfig"]

ALLOW_FRESH_START_ENV = ALLOW_FRESH_START.name  # set to 1 by ``goodput launch --allow-fresh-start``

_SECONDS_PER_YEAR = 365.0 * 86400.0
# The prior MTBF of a job whose failure rate nobody gave: one hour. A new job fails early and not only for the
# hardware reasons an AFR counts (configuration, bad nodes, out of memory), and published rates of large jobs
# are a few hours (see the README's checkpoint section); ``auto`` grows it with every failure-free second.
_PRIOR_MTBF = 3600.0


def _seconds(value: str | float, what: str) -> float:
    seconds = parse_duration(value, what=what) if isinstance(value, str) else float(value)
    if not seconds > 0:
        raise ConfigError(f"{what} must be positive, got {value!r}")
    return seconds


@dataclass(kw_only=True)
class CheckpointConfig:
    """Where, how and how often to checkpoint, and what to keep.

    Args:
        root: a local folder or an fsspec URL (``s3://bucket/run``); each checkpoint is ``<root>/step-<N>/``.
            Empty (the default): ``<run folder>/checkpoints`` under ``goodput.Run``; a ``CheckpointManager``
            used on its own needs one.
        strategy: ``"torch_save"`` (rank 0 writes one file), ``"dcp"`` (every rank writes its shard) or
            ``"dcp_async"`` (training pays only for the staging copy; the write runs in the background).
        every: an int (every N steps), a duration (``"10m"``: every 10 minutes of wall time) or ``"auto"``
            (the planner's optimum from the measured save cost and the failure rate).
        keep_last: how many of the newest committed checkpoints to keep (>= 1).
        keep_every: also keep every checkpoint whose step is a multiple of this (None: none extra).
        verify_checksums: record every file's checksum on save (computed while it is written) and check it on
            restore (while it is read). None: on for local folders, off for remote URLs.
        checksum: the checksum's algorithm: ``"xxh3_128"`` (xxHash, memory speed; the default) or ``"sha256"``.
        storage_options: fsspec options for remote roots (endpoint, credentials); never logged.
        async_checkpointer: for ``dcp_async``: ``"thread"`` or ``"process"``.
        max_interval: ``auto`` never waits longer than this between saves.
        gpus: GPUs in the job, for a prior from ``afr`` (None: the world size).
        afr: annual failure rate per GPU (0.05 = 5 % a year) when the fleet's is known: ``auto``'s prior MTBF
            is then a year over (GPUs x afr). None: one hour, whatever the job's size (see ``prior_mtbf``).
        restart: seconds (or a duration) a restart costs, for ``auto``.
        detect: seconds (or a duration) until a failure is noticed, for ``auto``.
        partial_grace: a partial folder whose save cannot be proven dead (another host) is removed at start-up
            only when older than this.
        memory: a node-local RAM tier saved often and restored first (None: the durable tier only).
        allow_fresh_start: what a restore does when committed checkpoints exist and none of them loads (each
            failed verification or loading): False stops the run with ``NoValidCheckpoint`` (a restart cannot
            fix it: exit 78 under ``goodput launch``); True warns and starts from step 0 beside them. None
            reads ``$GOODPUT_ALLOW_FRESH_START`` (``goodput launch --allow-fresh-start`` sets it to 1). Folders
            of saves that never committed (a job killed inside its first save) never stop a run.
    """

    root: str = ""
    strategy: str = "dcp_async"
    every: int | str = "auto"
    keep_last: int = 3
    keep_every: int | None = None
    verify_checksums: bool | None = None
    checksum: str = "xxh3_128"
    storage_options: dict[str, Any] = field(default_factory=dict)
    async_checkpointer: str = "thread"
    max_interval: str | float = "1h"
    gpus: int | None = None
    afr: float | None = None
    restart: str | float = 0.0
    detect: str | float = 0.0
    partial_grace: str | float = "1h"
    memory: MemoryTier | None = None
    allow_fresh_start: bool | None = None

    def rooted(self, run_dir: str) -> CheckpointConfig:
        """This config, with ``<run_dir>/checkpoints`` as its root when it has none (what a run defaults to)."""
        return self if self.root else replace(self, root=os.path.join(run_dir, "checkpoints"))

    def required_root(self) -> str:
        """The root; a config without one (which ``goodput.Run`` fills in) stops a manager in one line."""
        if not self.root:
            raise ConfigError(
                "CheckpointConfig has no root: give root= (a folder or a URL such as s3://bucket/run) when using "
                "a CheckpointManager on its own (under goodput.Run it defaults to <run folder>/checkpoints)"
            )
        return self.root

    def __post_init__(self) -> None:
        if not isinstance(self.root, str):
            raise ConfigError(f"root must be a folder path or URL string, got {self.root!r}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy {self.strategy!r} is unknown; choose one of {', '.join(STRATEGIES)}")
        if isinstance(self.every, bool) or not isinstance(self.every, int | str):
            raise ConfigError(
                f"every must be a step count, a duration like '10m' or 'auto', got {self.every!r}"
            )
        if isinstance(self.every, int) and self.every < 1:
            raise ConfigError(f"every must be at least 1 step, got {self.every}")
        if isinstance(self.every, str) and self.every != "auto":
            _seconds(self.every, "every")
        if not isinstance(self.keep_last, int) or self.keep_last < 1:
            raise ConfigError(
                f"keep_last must be an int >= 1 (the newest checkpoint is always kept), got {self.keep_last!r}"
            )
        if self.keep_every is not None and (not isinstance(self.keep_every, int) or self.keep_every < 1):
            raise ConfigError(f"keep_every must be None or an int >= 1, got {self.keep_every!r}")
        if self.checksum not in ("xxh3_128", "sha256"):
            raise ConfigError(f"checksum must be 'xxh3_128' or 'sha256', got {self.checksum!r}")
        if self.async_checkpointer not in ("thread", "process"):
            raise ConfigError(
                f"async_checkpointer must be 'thread' or 'process', got {self.async_checkpointer!r}"
            )
        _seconds(self.max_interval, "max_interval")
        _seconds(self.partial_grace, "partial_grace")
        if self.gpus is not None and (not isinstance(self.gpus, int) or self.gpus < 1):
            raise ConfigError(f"gpus must be None or an int >= 1, got {self.gpus!r}")
        if self.afr is not None and not (isinstance(self.afr, int | float) and self.afr > 0):
            raise ConfigError(f"afr must be a positive annual failure rate such as 0.05, got {self.afr!r}")
        for name in ("restart", "detect"):
            value = getattr(self, name)
            if (parse_duration(value, what=name) if isinstance(value, str) else float(value)) < 0:
                raise ConfigError(f"{name} must not be negative, got {value!r}")
        if self.gpus is not None and self.afr is None:
            import warnings

            warnings.warn("gpus has no effect without afr (the prior failure rate per GPU)", stacklevel=3)
        if self.memory is not None and not isinstance(self.memory, MemoryTier):
            raise ConfigError(f"memory must be a MemoryTier or None, got {self.memory!r}")
        if self.allow_fresh_start is not None and not isinstance(self.allow_fresh_start, bool):
            raise ConfigError(
                f"allow_fresh_start must be True, False or None, got {self.allow_fresh_start!r}"
            )
        if self.async_checkpointer == "process" and self.strategy != "dcp_async":
            import warnings

            warnings.warn("async_checkpointer has no effect unless strategy='dcp_async'", stacklevel=3)

    @property
    def every_steps(self) -> int | None:
        return self.every if isinstance(self.every, int) else None

    @property
    def every_seconds(self) -> float | None:
        return _seconds(self.every, "every") if isinstance(self.every, str) and self.every != "auto" else None

    def seconds(self, name: str) -> float:
        """A duration field in seconds (``max_interval``, ``restart``, ``detect``, ``partial_grace``)."""
        value = getattr(self, name)
        return parse_duration(value, what=name) if isinstance(value, str) else float(value)

    def prior_mtbf(self, world_size: int) -> float:
        """Seconds between failures of the job assumed before any is observed: a year over (GPUs x ``afr``), or
        one hour without ``afr``. ``auto`` adds the failure-free time seen so far (``AutoInterval``)."""
        if self.afr is None:
            return _PRIOR_MTBF
        return _SECONDS_PER_YEAR / ((self.gpus or world_size) * self.afr)

    def fresh_start_allowed(self) -> bool:
        """Whether a restore that finds committed checkpoints and loads none may start from step 0."""
        if self.allow_fresh_start is not None:
            return self.allow_fresh_start
        return ALLOW_FRESH_START.on()

    def checksums(self, local: bool) -> bool:
        return local if self.verify_checksums is None else self.verify_checksums

    def checksum_algorithm(self, local: bool) -> str | None:
        """The algorithm saves record and restores check (None: checksums off)."""
        return self.checksum if self.checksums(local) else None
