"""The restore path of ``CheckpointManager``: find the newest valid checkpoint, verify it, load it into the live
state on every rank, and time the restore's parts (find, verify, read, load, position) for the ledger.

A mixin of ``CheckpointManager`` (see ``manager.py``), kept apart so each file holds one part of the manager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from goodput.checkpoint._saving import _FAILURES, _describe, _quiet_single_process
from goodput.checkpoint.config import ALLOW_FRESH_START_ENV, CheckpointConfig
from goodput.checkpoint.layout import CheckpointLayout
from goodput.checkpoint.manifest import CheckpointInfo, Manifest
from goodput.checkpoint.memory.checkpointer import MemoryCheckpointer
from goodput.checkpoint.policy import SavePolicy, StepSchedule
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.strategy import SaveContext, make_strategy
from goodput.errors import CheckpointCorrupt, NoValidCheckpoint, StateMismatch, StorageError
from goodput.faults import fault_point

__all__: list[str] = []

log = logging.getLogger("goodput.checkpoint.manager")  # the manager's logger, as before the split


class _RestorePath:
    """``CheckpointManager``'s restore path (see the class; the attributes below are set by its ``__init__``)."""

    config: CheckpointConfig
    state: TrainingState
    rank: int
    world_size: int
    memory: MemoryCheckpointer | None
    _clock: Callable[[], float]
    _layout: CheckpointLayout
    _dist: bool
    _ctl: Any
    _ctx: SaveContext
    _policy: SavePolicy
    _memory_policy: SavePolicy | None
    _schedule: StepSchedule | None
    _memory_schedule: StepSchedule | None
    _checksums: bool
    _committed: set[int]
    _failed: set[int]
    _last_step: int | None
    _restore_parts: dict[str, float]

    if TYPE_CHECKING:  # provided by CheckpointManager / the other parts

        def _emit(self, name: str, **fields: Any) -> None: ...
        def _bcast(self, value: Any, group: Any = None) -> Any: ...
        def _check_open(self) -> None: ...
        def wait(self) -> Any: ...

    def restore_latest(self, *, at_most: int | None = None) -> int | None:
        """Load the newest valid checkpoint into the state; returns its step, or None when there is none.

        A checkpoint that fails verification or loading is skipped with a warning naming the file, and the
        next older one is tried. Committed checkpoints of which none loads stop the run (below), unless
        ``config.fresh_start_allowed()``; folders of saves that never committed are no checkpoints at all.

        ``at_most``: a rollback in place (``goodput.run.numeric``) loads no step newer than this one, and
        discards every newer checkpoint of both tiers: they belong to the timeline being abandoned (after a
        corrupted replica, they may hold its corruption), and the redone steps save those steps again.

        Raises:
            StateMismatch: the newest valid checkpoint does not fit the model/optimizer (names key and shapes).
            NoValidCheckpoint: committed checkpoints exist (durable ones, or memory-tier parts whose check
                failed) and none of them could be loaded, and a fresh start is not allowed.
        """
        self._check_open()
        _quiet_single_process()
        self.wait()
        started = self._clock()
        listing: tuple[list[tuple[int, str]], list[tuple[int, str]], str] = ([], [], "")
        if self.rank == 0:
            try:
                rows = self._layout.scan()
                committed = [(r.step, r.url) for r in rows if r.status == "committed"]
                listing = (committed, [(r.step, r.reason) for r in rows if r.status == "corrupt"], "")
            except Exception as err:  # every rank waits for rank 0's word: always send one
                listing = ([], [], f"{type(err).__name__}: {err}")
        candidates, skipped, error = self._bcast(listing)
        if error:
            raise StorageError(f"cannot list the checkpoints under {self._layout.root}: {error}")
        if at_most is not None:
            self._discard_newer([(step, url) for step, url in candidates if step > at_most])
            candidates = [(step, url) for step, url in candidates if step <= at_most]
            skipped = [(step, why) for step, why in skipped if step <= at_most]  # the abandoned timeline's
        self._committed = {step for step, _ in candidates}
        self._failed = {step for step, _ in skipped}  # failed to load: saved over, not skipped (``_begin``)
        self._restore_parts = {"find": self._clock() - started}
        start = self._clock()
        if self.memory is not None:  # memory first, unless the durable tier holds a newer step
            found = self.memory.restore(at_least=candidates[0][0] if candidates else None, at_most=at_most)
            if found is not None:
                self._warn_skipped(skipped)
                return self._restored(found.step, start, tier=found.tier, source=found.source)
        for step, url in candidates:
            failure = self._try_load(step, url)
            if failure is not None:
                skipped.append((step, failure))
                self._committed.discard(step)  # a damaged step is saved over when training reaches it again
                self._failed.add(step)
                continue
            self._warn_skipped(skipped)
            self._emit(
                "restore_parts", step=step, **{f"{k}_seconds": v for k, v in self._restore_parts.items()}
            )
            fault_point("restore", step)  # loaded, not yet in use
            self._last_step = step
            return self._restored(step, start, tier="durable", source="durable")
        self._none_loaded(skipped)
        if self.memory is not None and self.memory.overwritten:
            raise CheckpointCorrupt(
                "a damaged memory-tier part was read into the live state and no other checkpoint could be"
                " loaded over it; restart the job (the damaged part is discarded: it starts from the beginning)"
            )
        return None

    def _discard_newer(self, newer: list[tuple[int, str]]) -> None:
        """Rank 0 deletes these durable checkpoints (newer than a rollback's step); every rank waits for it."""
        if self.rank == 0:
            for step, url in newer:
                log.warning(
                    "rollback: discarding checkpoint step %d (%s), newer than the step restored", step, url
                )
                try:
                    self._layout.remove(CheckpointInfo(step=step, url=url, status="committed"))
                except Exception as err:  # a later save of that step must not find it committed: say so
                    log.warning("rollback: could not delete %s: %s", url, err)
        self._bcast(None)

    def _warn_skipped(self, skipped: list[tuple[int, str]]) -> None:
        """Name each checkpoint passed over on the way to the one restored (rank 0 speaks for every rank)."""
        for step, reason in sorted(skipped, reverse=True) if self.rank == 0 else []:
            log.warning("skipping checkpoint step %d: %s", step, reason)

    def _none_loaded(self, skipped: list[tuple[int, str]]) -> None:
        """No tier loaded a step: stop when committed checkpoints failed (unless a fresh start is allowed).

        Starting from step 0 would throw their training away without a word, and write new step folders
        beside the damaged ones; every restart would find the same damage, so this is not worth retrying.
        """
        memory = self.memory.failures if self.memory is not None else []
        failures = sorted(skipped, reverse=True) + sorted(memory, reverse=True)
        if not failures:
            return  # nothing was ever committed: the run starts from the beginning
        count = len({step for step, _ in skipped}) + len({step for step, _ in memory})
        step, reason = failures[0]
        where = "memory-tier " if not skipped else ""
        which = (
            "the only committed checkpoint" if count == 1 else f"none of the {count} committed checkpoints"
        )
        what = (
            f"{which} under {self._layout.root} could be loaded"
            f" (newest failure: {where}step {step}: {reason.splitlines()[0] if reason else '?'})"
        )
        if not self.config.fresh_start_allowed():
            raise NoValidCheckpoint(
                f"{what}; to train from step 0 beside them, relaunch with goodput launch --allow-fresh-start"
                f" (or {ALLOW_FRESH_START_ENV}=1, or CheckpointConfig(allow_fresh_start=True))"
            )
        self._warn_skipped(skipped)
        if self.rank == 0:
            log.warning("%s; starting from step 0, as allow_fresh_start permits", what)

    def _restored(self, step: int, start: float, *, tier: str, source: str) -> int:
        self.state.step = step
        self._policy.saved(step, self._clock())
        if self._memory_policy is not None:
            self._memory_policy.saved(step, self._clock())
        for schedule in (self._schedule, self._memory_schedule):
            if schedule is not None:
                schedule.reset()
        self._emit("checkpoint_restored", step=step, tier=tier, source=source, seconds=self._clock() - start)
        return step

    def _try_load(self, step: int, url: str) -> str | None:
        """Verify and load ``step`` on every rank; None when loaded, else why not (the same on every rank)."""
        verdict: tuple[str, Any] = ("ok", None)
        started = self._clock()
        if self.rank == 0:
            try:
                verdict = ("ok", self._verify(url))
            except CheckpointCorrupt as err:
                verdict = ("corrupt", str(err))
            except Exception as err:  # storage trouble, not a bad checkpoint: stop rather than fall back
                verdict = ("unreachable", f"{type(err).__name__}: {err}")
        verdict = self._bcast(verdict)
        if verdict[0] == "unreachable":
            raise StorageError(f"cannot verify {url}: {verdict[1]}")
        if verdict[0] != "ok":
            return str(verdict[1])
        manifest: Manifest = verdict[1]
        if manifest.world_size != self.world_size:  # resharded by the strategy; see TrainingState
            log.info(
                "restoring step %d saved by %d ranks onto %d", step, manifest.world_size, self.world_size
            )
        mine: tuple[str, str] = ("ok", "")
        verified = self._clock()
        strategy = make_strategy(manifest.strategy, self._ctx)
        # strategies that verify while reading get the manifest's entries (one pass over the bytes)
        self._ctx.options["expected"] = manifest.files if self._checksums else None
        try:
            strategy.load(self.state, url, self._ctx)
        except StateMismatch as err:
            mine = ("mismatch", str(err))
        except _FAILURES as err:
            mine = ("error", f"rank {self.rank}: {_describe(err)}")
        finally:
            self._ctx.options.pop("expected", None)
        parts: dict[str, float] = dict(getattr(strategy, "last_load_seconds", None) or {})
        if not parts:
            parts = {"load": self._clock() - verified}
        self._restore_parts = {
            "find": self._restore_parts.get("find", 0.0),
            "verify": verified - started,
            **parts,
        }
        outcomes = self._all_gather(mine)  # every rank learns every rank's outcome: no rank is left waiting
        mismatches = [detail for status, detail in outcomes if status == "mismatch"]
        if mismatches:
            raise StateMismatch(f"{url}: {mismatches[0]}")
        failures = [detail for status, detail in outcomes if status != "ok"]
        if failures:
            return f"{url}: loading failed: {'; '.join(failures)}"
        log.info("restored step %d from %s", step, url)
        return None

    def _verify(self, url: str) -> Manifest:
        """Rank 0's check before loading: sizes always; checksums here only for strategies that do not check
        them while reading (DCP's strategies verify each file as they read it)."""
        manifest = self._layout.verify(url, checksums=False)
        if self._checksums and not getattr(_strategy_class(manifest.strategy), "verifies_on_read", False):
            manifest = self._layout.verify(url, checksums=True)
        return manifest

    def _all_gather(self, mine: Any) -> list[Any]:
        if not self._dist:
            return [mine]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, mine, group=self._ctl)
        return out


def _strategy_class(name: str) -> type | None:
    if name == "torch_save":
        from goodput.checkpoint.torch_save import TorchSaveStrategy

        return TorchSaveStrategy
    if name in ("dcp", "dcp_async"):
        from goodput.checkpoint.dcp import DcpStrategy

        return DcpStrategy
    return None
