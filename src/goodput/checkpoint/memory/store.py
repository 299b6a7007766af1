"""The memory tier's configuration and its node-local folder: parts, markers, retention, clean-up.

A node's folder is ``<folder>/<run id>/node-<n>/``; it lives on a RAM file system (``/dev/shm`` by default),
so it outlives the training processes but not the machine. Inside it::

    step-<N>/rank-<r>.part      rank r's complete state (see memory_format)
    step-<N>/rank-<r>.json      its marker: run id, step, rank, world size, size, xxh3-64; written last
    replicas/step-<N>/...       the same files of a peer node's ranks (replication for node loss)
    spare-rank-<r>.part         rank r's newest part dropped by retention, kept to be overwritten by its next
                                save (its RAM pages stay allocated: no page faults while writing; never read)

A part counts only with its marker, and only when size and checksum match: a truncated part, a changed byte
or a missing marker is skipped with a warning. The run id comes from the durable root, so a later run never
loads another run's memory checkpoints; the run's folder is removed when the run finishes, and folders of
dead runs are removed once older than ``stale_after``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

from goodput.checkpoint.memory.format import CHECKSUM
from goodput.errors import CheckpointCorrupt, ConfigError
from goodput.units import parse_duration

__all__ = ["MemoryStore", "MemoryTier", "PartIncomplete"]

log = logging.getLogger(__name__)

OWNER_FILE = "goodput-memory.json"


class PartIncomplete(CheckpointCorrupt):
    """A part without its marker: a save that never completed (the usual trace of a kill during a write)."""


@dataclass(kw_only=True)
class MemoryTier:
    """Checkpoints in node-local RAM, saved often and restored first.

    Args:
        every: steps between memory saves (int), a duration (``"30s"``), or ``"auto"`` (the planner's optimum
            for the measured memory-tier costs).
        replicas: 1 copies each node's parts to the next node's memory tier (survives the loss of one node);
            0 keeps them local only.
        keep: memory checkpoints kept per node (>= 2: a rank may be one save ahead of another when a job
            dies, and the newest step every rank holds must survive). Each rank also keeps one spare part (the
            last one retention dropped) for its next save to overwrite in place: RAM use is ``keep + 1`` parts.
        folder: the RAM folder (tmpfs) under which each run keeps its own folder.
        stale_after: another run's folder older than this is removed at start-up (its run is dead).
        node_loss_share: for ``auto``: the share of failures that lose a node's RAM. The memory tier recovers
            the others (and, with a replica, node losses too unless the peer is lost as well); the durable
            tier's ``auto`` interval plans only for what the memory tier cannot recover.
    """

    every: int | str = "auto"
    replicas: int = 1
    keep: int = 2
    folder: str = "/dev/shm/goodput"
    stale_after: str | float = "1d"
    node_loss_share: float = 0.3

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int | str):
            raise ConfigError(f"memory every must be steps, a duration or 'auto', got {self.every!r}")
        if isinstance(self.every, int) and self.every < 1:
            raise ConfigError(f"memory every must be at least 1 step, got {self.every}")
        if isinstance(self.every, str) and self.every != "auto":
            parse_duration(self.every, what="memory every")
        if self.replicas not in (0, 1):
            raise ConfigError(f"memory replicas must be 0 or 1, got {self.replicas!r}")
        if not isinstance(self.keep, int) or self.keep < 2:
            raise ConfigError(
                f"memory keep must be an int >= 2 (one rank may be a save ahead of another), got {self.keep!r}"
            )
        if not (isinstance(self.node_loss_share, int | float) and 0.0 <= self.node_loss_share <= 1.0):
            raise ConfigError(f"memory node_loss_share must be in [0, 1], got {self.node_loss_share!r}")
        if not isinstance(self.folder, str) or not self.folder:
            raise ConfigError(f"memory folder must be a local folder path, got {self.folder!r}")

    @property
    def every_steps(self) -> int | None:
        return self.every if isinstance(self.every, int) else None

    @property
    def every_seconds(self) -> float | None:
        if isinstance(self.every, str) and self.every != "auto":
            return parse_duration(self.every, what="memory every")
        return None

    @property
    def stale_seconds(self) -> float:
        value = self.stale_after
        return parse_duration(value, what="stale_after") if isinstance(value, str) else float(value)


def _write_json(path: str, value: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # nodes simulated on one machine share the run folder
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def _step_of(name: str) -> int | None:
    head, _, tail = name.partition("-")
    return int(tail) if head == "step" and tail.isdigit() else None


class MemoryStore:
    """One node's memory-tier folder for one run.

    Args:
        tier: the configuration.
        run_id: the run's identity (checked in every marker).
        node: this node's number.
    """

    def __init__(self, tier: MemoryTier, run_id: str, node: int) -> None:
        self.tier = tier
        self.run_id = run_id
        self.node = node
        self.run_dir = os.path.join(tier.folder, run_id)
        self.node_dir = os.path.join(self.run_dir, f"node-{node}")
        self.pinned: int | None = None  # keep the newest committed step at or before this one (see pin)
        self.anchor: int | None = None  # ... which is this step, kept by retention beside the newest ``keep``

    # ---- paths ---------------------------------------------------------------------------------------------
    def step_dir(self, step: int, *, replica: bool = False) -> str:
        base = os.path.join(self.node_dir, "replicas") if replica else self.node_dir
        return os.path.join(base, f"step-{step}")

    def part_path(self, step: int, rank: int, *, replica: bool = False) -> str:
        return os.path.join(self.step_dir(step, replica=replica), f"rank-{rank}.part")

    def spare_path(self, rank: int) -> str:
        return os.path.join(self.node_dir, f"spare-rank-{rank}.part")

    def recycle(self, rank: int, path: str) -> None:
        """Move rank's spare part (if any) to ``path``, to be overwritten in place by the next write."""
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.spare_path(rank), path)

    # ---- start-up and end ------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create this run's node folder (with its owner file) and remove other runs' stale folders."""
        os.makedirs(self.node_dir, exist_ok=True)
        owner = os.path.join(self.run_dir, OWNER_FILE)
        if not os.path.exists(owner):
            _write_json(owner, {"run": self.run_id, "created": time.time()})
        self._clean_stale()

    def _clean_stale(self) -> None:
        try:
            names = os.listdir(self.tier.folder)
        except OSError:
            return
        now = time.time()
        for name in names:
            path = os.path.join(self.tier.folder, name)
            if name == self.run_id or not os.path.isfile(os.path.join(path, OWNER_FILE)):
                continue  # ours, or not provably written by goodput: never touched
            newest = max((e.stat().st_mtime for e in os.scandir(path)), default=0.0)
            if now - newest > self.tier.stale_seconds:
                log.info("removing the stale memory-tier folder %s of a finished run", path)
                shutil.rmtree(path, ignore_errors=True)

    def wipe_node(self) -> None:
        """Remove this node's folder (a lost node comes back with empty RAM)."""
        shutil.rmtree(self.node_dir, ignore_errors=True)

    def remove_run(self) -> None:
        """Remove this run's whole folder (the run finished)."""
        shutil.rmtree(self.run_dir, ignore_errors=True)

    # ---- writing -------------------------------------------------------------------------------------------
    def begin(self, step: int, *, replica: bool = False) -> str:
        folder = self.step_dir(step, replica=replica)
        os.makedirs(folder, exist_ok=True)
        return folder

    def mark(
        self, step: int, rank: int, world: int, size: int, digest: str, *, replica: bool = False
    ) -> None:
        """Write the marker that makes a part count (after its bytes are written)."""
        marker = {"run": self.run_id, "step": step, "rank": rank, "world": world, "bytes": size,
                  CHECKSUM: digest}  # fmt: skip
        _write_json(self.part_path(step, rank, replica=replica)[: -len(".part")] + ".json", marker)

    # ---- reading -------------------------------------------------------------------------------------------
    def steps(self, *, replica: bool = False) -> list[int]:
        base = os.path.join(self.node_dir, "replicas") if replica else self.node_dir
        try:
            names = os.listdir(base)
        except FileNotFoundError:
            return []
        return sorted((s for s in map(_step_of, names) if s is not None), reverse=True)

    def marker(self, step: int, rank: int, world: int, *, replica: bool = False) -> dict[str, Any]:
        """The marker of rank's part at step, checked against this run.

        Raises:
            PartIncomplete: no marker (the part was never completed: a save a kill interrupted).
            CheckpointCorrupt: a marker of another run or world size, or one of an older goodput's format.
        """
        path = self.part_path(step, rank, replica=replica)[: -len(".part")] + ".json"
        try:
            with open(path) as f:
                marker = json.load(f)
        except FileNotFoundError:
            raise PartIncomplete(f"{path} is missing: the part was never completed") from None
        except ValueError as err:
            raise CheckpointCorrupt(f"{path} is unreadable: {err}") from None
        if marker.get("run") != self.run_id:
            raise CheckpointCorrupt(f"{path} belongs to another run ({marker.get('run')!r})")
        if CHECKSUM not in marker:  # a part of an older goodput (CRC-32 markers): not read, never trusted
            raise CheckpointCorrupt(f"{path} was written by an older goodput (no {CHECKSUM} checksum)")
        if marker.get("step") != step or marker.get("rank") != rank or marker.get("world") != world:
            raise CheckpointCorrupt(f"{path} describes step {marker.get('step')} rank {marker.get('rank')}"
                                    f" of {marker.get('world')} ranks")  # fmt: skip
        return dict(marker)

    def ranks_in(self, step: int, *, replica: bool = False) -> list[int]:
        try:
            names = os.listdir(self.step_dir(step, replica=replica))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if name.startswith("rank-") and name.endswith(".part"):
                text = name[len("rank-") : -len(".part")]
                if text.isdigit():
                    out.append(int(text))
        return sorted(out)

    def read(self, step: int, rank: int, *, replica: bool = False) -> memoryview:
        """A part's bytes, mapped read-only rather than copied (a RAM folder's pages are mapped in place)."""
        path = self.part_path(step, rank, replica=replica)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return memoryview(b"")
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            return memoryview(mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ))

    # ---- retention -----------------------------------------------------------------------------------------
    def pin(self, step: int) -> None:
        """Keep the newest committed step at or before ``step`` however many newer saves follow, until a later
        pin: the numeric guard's rollback target for a corrupted replica (its last check where every replica
        agreed), which a short save interval would otherwise push out of the newest ``keep``."""
        self.pinned = step

    def committed_after(self, step: int, committed: list[int]) -> list[int]:
        """The newest ``keep`` committed steps once ``step`` (newer than all of ``committed``) committed; the
        pinned step's checkpoint, while still among ``committed``, becomes the anchor retention keeps."""
        steps = [step, *committed]
        pinned = self.pinned
        if pinned is not None:
            self.anchor = max((s for s in steps if s <= pinned), default=self.anchor)
        return steps[: self.tier.keep]

    def retain(self, committed: list[int], rank: int | None, *, replica: bool = False) -> None:
        """Remove ``rank``'s parts (None: every part) of steps older than the newest ``keep`` committed ones, but
        the anchor (see :meth:`pin`).

        ``committed``: steps every rank completed, newest first. The newest committed step is always kept. One
        removed own part per rank is kept as its spare (see the module docstring): ``keep + 1`` parts per rank.
        """
        kept = set(committed[: self.tier.keep])
        if not kept:
            return
        floor = min(kept)
        if self.anchor is not None:
            kept.add(self.anchor)
        for step in self.steps(replica=replica):
            if step >= floor or step in kept:
                continue
            if rank is None:
                shutil.rmtree(self.step_dir(step, replica=replica), ignore_errors=True)
            else:
                self.drop(step, rank, replica=replica)

    def drop(self, step: int, rank: int, *, replica: bool = False) -> None:
        """Remove ``rank``'s part of ``step``: its marker first (the part no longer counts), then the part (an own
        part becomes the rank's spare when it has none), then the step folder once no rank's part is left."""
        folder = self.step_dir(step, replica=replica)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(folder, f"rank-{rank}.json"))
        part = os.path.join(folder, f"rank-{rank}.part")
        with contextlib.suppress(FileNotFoundError):
            if replica or os.path.exists(self.spare_path(rank)):
                os.remove(part)
            else:
                os.replace(part, self.spare_path(rank))
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # the last rank to leave removes the step folder
