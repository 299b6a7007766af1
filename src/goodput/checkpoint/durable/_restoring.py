"""The durable tier's restore path: list the committed checkpoints, verify one, load it into the live state on
every rank, and time the restore's parts (find, verify, read, load, position) for the ledger.

One part of the durable tier (``checkpointer.py``); what the manager does with the checkpoints every tier
passed over is :func:`warn_damage` and, when no tier loads a step, :func:`none_loaded`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from goodput.checkpoint._collectives import Collectives
from goodput.checkpoint._saving import FAILURES, describe
from goodput.checkpoint.config import ALLOW_FRESH_START_ENV, CheckpointConfig
from goodput.checkpoint.durable.layout import CheckpointLayout
from goodput.checkpoint.durable.manifest import CheckpointInfo, Manifest
from goodput.checkpoint.durable.strategy import SaveContext, make_strategy
from goodput.checkpoint.state import TrainingState
from goodput.checkpoint.tier import Damage
from goodput.errors import CheckpointCorrupt, NoValidCheckpoint, StateMismatch, StorageError

__all__ = ["DurableReader", "none_loaded", "warn_damage"]

log = logging.getLogger("goodput.checkpoint.manager")  # the manager's logger: one name for its messages

Listing = tuple[list[tuple[int, str]], list[tuple[int, str]]]


class DurableReader:
    """Finds, verifies and loads durable checkpoints; every rank calls each method at the same point.

    ``parts`` holds the last restore's seconds by part (``find``, ``verify``, then the strategy's own).
    """

    def __init__(
        self,
        config: CheckpointConfig,
        state: TrainingState,
        layout: CheckpointLayout,
        coll: Collectives,
        ctx: SaveContext,
        clock: Callable[[], float],
    ) -> None:
        self.config, self.state, self.layout = config, state, layout
        self.coll, self.ctx, self.clock = coll, ctx, clock
        self.checksums = config.checksums(layout.local)
        self.parts: dict[str, float] = {}

    def listing(self) -> Listing:
        """(committed, corrupt): (step, url) of every committed checkpoint, newest first, and (step, why) of
        every damaged one; rank 0 lists, every rank gets its word.

        Raises:
            StorageError: the root cannot be listed.
        """

        def scan() -> tuple[list[tuple[int, str]], list[tuple[int, str]], str]:
            rows = self.layout.scan()
            committed = [(r.step, r.url) for r in rows if r.status == "committed"]
            return committed, [(r.step, r.reason) for r in rows if r.status == "corrupt"], ""

        candidates, skipped, error = self.coll.rank0_decides(
            scan, lambda err: ([], [], f"{type(err).__name__}: {err}")
        )
        if error:
            raise StorageError(f"cannot list the checkpoints under {self.layout.root}: {error}")
        return candidates, skipped

    def discard_newer(self, newer: list[tuple[int, str]]) -> None:
        """Rank 0 deletes these durable checkpoints (newer than a rollback's step); every rank waits for it."""
        if self.coll.rank == 0:
            for step, url in newer:
                log.warning(
                    "rollback: discarding checkpoint step %d (%s), newer than the step restored", step, url
                )
                try:
                    self.layout.remove(CheckpointInfo(step=step, url=url, status="committed"))
                except Exception as err:  # a later save of that step must not find it committed: say so
                    log.warning("rollback: could not delete %s: %s", url, err)
        self.coll.bcast(None)

    def try_load(self, step: int, url: str) -> str | None:
        """Verify and load ``step`` on every rank; None when loaded, else why not (the same on every rank)."""
        started = self.clock()

        def verify() -> tuple[str, Any]:
            try:
                return "ok", self._verify(url)
            except CheckpointCorrupt as err:
                return "corrupt", str(err)

        # storage trouble, not a bad checkpoint: stop rather than fall back
        verdict: tuple[str, Any] = self.coll.rank0_decides(
            verify, lambda err: ("unreachable", f"{type(err).__name__}: {err}")
        )
        if verdict[0] == "unreachable":
            raise StorageError(f"cannot verify {url}: {verdict[1]}")
        if verdict[0] != "ok":
            return str(verdict[1])
        manifest: Manifest = verdict[1]
        if manifest.world_size != self.coll.world_size:  # resharded by the strategy; see TrainingState
            log.info(
                "restoring step %d saved by %d ranks onto %d", step, manifest.world_size, self.coll.world_size
            )
        mine: tuple[str, str] = ("ok", "")
        verified = self.clock()
        strategy = make_strategy(manifest.strategy, self.ctx)
        # strategies that verify while reading get the manifest's entries (one pass over the bytes)
        self.ctx.options["expected"] = manifest.files if self.checksums else None
        try:
            strategy.load(self.state, url, self.ctx)
        except StateMismatch as err:
            mine = ("mismatch", str(err))
        except FAILURES as err:
            mine = ("error", f"rank {self.coll.rank}: {describe(err)}")
        finally:
            self.ctx.options.pop("expected", None)
        parts: dict[str, float] = dict(getattr(strategy, "last_load_seconds", None) or {})
        if not parts:
            parts = {"load": self.clock() - verified}
        self.parts = {"find": self.parts.get("find", 0.0), "verify": verified - started, **parts}
        outcomes = self.coll.all_gather(
            mine
        )  # every rank learns every rank's outcome: no rank is left waiting
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
        manifest = self.layout.verify(url, checksums=False)
        if self.checksums and not getattr(_strategy_class(manifest.strategy), "verifies_on_read", False):
            manifest = self.layout.verify(url, checksums=True)
        return manifest


def warn_damage(damages: list[tuple[str, Damage]], rank: int) -> None:
    """Name each checkpoint passed over on the way to the one restored that its tier did not name itself
    (rank 0 speaks for every rank)."""
    for _name, damage in damages if rank == 0 else []:
        for step, reason in [] if damage.logged else damage.skipped:
            log.warning("skipping checkpoint step %d: %s", step, reason)


def none_loaded(config: CheckpointConfig, root: str, damages: list[tuple[str, Damage]], *, rank: int) -> None:
    """No tier loaded a step: stop when committed checkpoints failed (unless a fresh start is allowed).

    ``root``: where the run's record lives. ``damages``: each tier's name and what it could not load, the run's
    record (the durable tier) first.
    Starting from step 0 would throw their training away without a word, and write new step folders beside the
    damaged ones; every restart would find the same damage, so this is not worth retrying.
    """
    failures = [
        (step, reason, "" if i == 0 else f"{name}-tier ")
        for i, (name, damage) in enumerate(damages)
        for step, reason in damage.skipped
    ]
    if not failures:
        return  # nothing was ever committed: the run starts from the beginning
    count = sum(len({step for step, _ in damage.skipped}) for _, damage in damages)
    step, reason, where = failures[0]
    which = (
        f"the only committed checkpoint under {root} could not be loaded"
        if count == 1
        else f"none of the {count} committed checkpoints under {root} could be loaded"
    )
    what = f"{which} (newest failure: {where}step {step}: {reason.splitlines()[0] if reason else '?'})"
    if not config.fresh_start_allowed():
        raise NoValidCheckpoint(
            f"{what}; to train from step 0 beside them, relaunch with goodput launch --allow-fresh-start"
            f" (or {ALLOW_FRESH_START_ENV}=1, or CheckpointConfig(allow_fresh_start=True))"
        )
    warn_damage(damages, rank)
    if rank == 0:
        log.warning("%s; starting from step 0, as allow_fresh_start permits", what)


def _strategy_class(name: str) -> type | None:
    if name == "torch_save":
        from goodput.checkpoint.durable.torch_save import TorchSaveStrategy

        return TorchSaveStrategy
    if name in ("dcp", "dcp_async"):
        from goodput.checkpoint.durable.dcp import DcpStrategy

        return DcpStrategy
    return None
