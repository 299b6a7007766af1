"""Lightning: goodput's ledger, checkpoints and exactly-once data inside ``Trainer.fit`` (``pip install 'goodput[lightning]'``).

    goodput_cb = GoodputCallback(checkpoint=gp.CheckpointConfig(root="runs/l1/checkpoints", every=50),
                                 loader=gp.ResumableLoader(dataset, batch_size=32, seed=0, drop_last=True))
    trainer = L.Trainer(strategy=GoodputDDPStrategy(checkpoint_io=goodput_cb.checkpoint_io),
                        callbacks=[goodput_cb], max_steps=1000, use_distributed_sampler=False)
    trainer.fit(model, train_dataloaders=goodput_cb.loader, ckpt_path=goodput_cb.resume_path)

* :class:`GoodputCallback` writes the ledger (steps, each step's wait for data, checkpoint stalls, restores,
  attempts), fires goodput's fault plan (``$GOODPUT_FAULTS``) and saves when goodput's policy says so, so
  ``goodput report`` works on a Lightning run and ``goodput launch --faults`` drills it; under
  ``goodput verify-resume`` it records each step and the final state as ``goodput.Run`` does.
* :class:`GoodputCheckpointIO` is Lightning's ``CheckpointIO`` extension point backed by goodput's
  :class:`~goodput.checkpoint.CheckpointManager`: every strategy (``torch_save``, ``dcp``, ``dcp_async``), the
  verified commit, retention, and restore of the newest valid checkpoint with fallback. The tensors travel
  through goodput's :class:`~goodput.checkpoint.TrainingState` (model, optimizer, scheduler, RNG, data position);
  Lightning's loop progress rides along as JSON.
* goodput's manager is collective (every rank saves its part), while Lightning's stock strategies call a
  ``CheckpointIO`` on rank 0 only, and restore before they create the optimizers and LR schedulers.
  :class:`GoodputDDPStrategy` is DDP that hands the save to every rank and restores after its setup, so the
  live optimizer and scheduler (and the precision plugin's gradient scaler) are saved and restored; use it
  for one process too.
* Exactly-once data: Lightning fetches one batch ahead, so the loader's live position is one batch past the
  step being saved. ``goodput_cb.loader`` wraps the :class:`~goodput.data.ResumableLoader` and remembers the
  position after each delivered batch; a checkpoint of step ``s`` holds the position right after batch ``s``.
* After a mid-epoch resume the progress bar reads as in an uninterrupted fit: Lightning runs no epoch-start
  hook for that epoch, and the callback gives the bar that hook (see ``goodput.integrations._progress_bar``).

Lightning is imported when this module is; ``import goodput`` never imports it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.strategies import DDPStrategy

from goodput._env import RUN_DIR
from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState, list_checkpoints
from goodput.errors import CheckpointError, ConfigError, SaveFailed
from goodput.faults import FaultPlan, install_faults
from goodput.integrations._faults import export as _export
from goodput.integrations._faults import install_plan
from goodput.integrations._progress_bar import show_epoch_start
from goodput.integrations._tracked import TrackedLoader
from goodput.ledger.exporters import MetricsExporter
from goodput.ledger.ledger import Ledger
from goodput.run._setup import interval_fields
from goodput.run.records import StepRecorder

__all__ = ["GoodputCallback", "GoodputCheckpointIO", "GoodputDDPStrategy"]

log = logging.getLogger(__name__)
RESUME_PATH = "goodput://latest"
_LIGHTNING_KEYS = ("epoch", "global_step", "loops", "callbacks")


class GoodputCheckpointIO(CheckpointIO):
    """Lightning's ``CheckpointIO`` over goodput's checkpoint manager (see the module docstring).

    Must be called on every rank (:class:`GoodputDDPStrategy` does; a single process needs nothing more). The
    ``path`` Lightning passes is ignored: checkpoints live in ``config.root`` as goodput's ``step-N/`` folders,
    and :data:`RESUME_PATH` restores the newest valid one.
    """

    def __init__(self, config: CheckpointConfig) -> None:
        self.config = config
        self._trainer: Any = None
        self._loader: TrackedLoader | None = None
        self._ledger: Ledger | None = None
        self._manager: CheckpointManager | None = None

    def attach(self, trainer: Any, loader: TrackedLoader | None, ledger: Ledger | None) -> None:
        """Bind to the trainer whose live objects are saved (the callback does this in ``setup``)."""
        self._trainer, self._loader, self._ledger = trainer, loader, ledger

    @property
    def manager(self) -> CheckpointManager:
        """The checkpoint manager, built on first use (a collective: every rank gets here together)."""
        if self._manager is None:
            if self._trainer is None:
                raise ConfigError(
                    "GoodputCheckpointIO is not attached: add its GoodputCallback to the Trainer"
                )
            state = TrainingState(loader=self._loader)
            on_event = self._ledger.on_event if self._ledger is not None else None
            self._manager = CheckpointManager(self.config, state, on_event=on_event)
        return self._manager

    def bound_state(self) -> TrainingState:
        """The state the checkpoints are made of, bound to what the trainer owns now (see :meth:`_bound`)."""
        return self._bound().state

    def _bound(self) -> CheckpointManager:
        """The manager, its state bound to what the trainer owns now.

        Lightning creates the optimizers and schedulers in the strategy's setup, after the callbacks' ``setup``
        and (for most strategies) after it restores a checkpoint; and a strategy may replace them. So the
        state is bound anew before every restore and save, never once for all.
        """
        manager = self.manager
        _bind(manager.state, self._trainer)
        return manager

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        """Save the live state as the checkpoint's ``global_step`` (Lightning's non-tensor progress as JSON)."""
        manager = self._bound()
        step = int(checkpoint["global_step"])
        manager.state.extras = {"lightning": _json_part(checkpoint)}
        manager.save(step)

    def load_checkpoint(
        self, path: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Restore the newest valid checkpoint into the live objects; return Lightning's view of it."""
        if str(path) != RESUME_PATH:
            raise ConfigError(
                f"GoodputCheckpointIO restores {RESUME_PATH!r} (goodput_cb.resume_path), not {path!r}"
            )
        manager = self._bound()
        if self._ledger is not None:
            self._ledger.restore_start()
        step = manager.restore_latest()
        if self._ledger is not None:
            self._ledger.restore_end(step)
        if step is None:
            raise CheckpointError(
                f"no valid checkpoint under {self.config.root} (every one failed verification)"
            )
        trainer, saved = self._trainer, manager.state.extras.get("lightning", {})
        return {
            **saved,
            "pytorch-lightning_version": pl.__version__,
            "state_dict": trainer.lightning_module.state_dict(),
            "optimizer_states": [o.state_dict() for o in trainer.optimizers],
            "lr_schedulers": [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs],
        }

    def remove_checkpoint(self, path: Any) -> None:
        """Nothing: goodput's retention (``keep_last``, ``keep_every``) removes old checkpoints."""

    def teardown(self) -> None:
        """Wait until the last save is durable and release the manager's groups."""
        if self._manager is not None:
            manager, self._manager = self._manager, None
            manager.close()

    def abandon(self, step: int) -> None:
        """Release the manager after ``fit`` failed at ``step`` (nothing more is saved: the job resumes from the
        newest checkpoint), saying in a Lightning user's terms when that step has no checkpoint."""
        if self._manager is None:
            return
        manager, self._manager = self._manager, None
        with contextlib.suppress(SaveFailed):  # the fit's own error is the one to report
            manager.close(finished=False, warn=False)
        newest = max(manager.committed, default=None)
        if newest != step:
            log.warning(
                "fit failed after step %d, which no checkpoint holds (newest: %s); "
                "fit(..., ckpt_path=goodput_cb.resume_path) resumes from the newest",
                step,
                "none" if newest is None else f"step {newest}",
            )


class GoodputDDPStrategy(DDPStrategy):
    """DDP whose checkpoint saves run on every rank, as goodput's collective checkpoint manager needs.

    It also restores after its setup: goodput loads the checkpoint into the live optimizers and schedulers,
    which Lightning creates in the setup (DDP's stock order restores before it, into no optimizer at all).
    """

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def remove_checkpoint(self, filepath: Any) -> None:
        self.checkpoint_io.remove_checkpoint(filepath)


class GoodputCallback(pl.Callback):
    """Ledger, fault plan, save policy and exactly-once data for a Lightning ``fit`` (see the module docstring).

    Args:
        run_dir: the run folder (ledger, fault markers). None: ``$GOODPUT_RUN_DIR`` (set by ``goodput launch``).
        checkpoint: where, how and how often to save (default: ``dcp`` every 100 steps under
            ``run_dir/checkpoints``).
        loader: a :class:`~goodput.data.ResumableLoader`; pass ``goodput_cb.loader`` to ``fit``.
        exporters: receive each step's live goodput and fetch time (e.g. ``PrometheusExporter``).
    """

    def __init__(
        self,
        run_dir: str | None = None,
        *,
        checkpoint: CheckpointConfig | None = None,
        loader: Any = None,
        exporters: Sequence[MetricsExporter] = (),
    ) -> None:
        run_dir = run_dir or RUN_DIR.get() or None
        if not run_dir:
            raise ConfigError("GoodputCallback needs a run folder: pass run_dir or set GOODPUT_RUN_DIR")
        self.run_dir = run_dir
        self.ledger = Ledger(run_dir)  # first, so the attempt's time counts from process start
        config = (checkpoint or CheckpointConfig(strategy="dcp", every=100)).rooted(run_dir)
        self.checkpoint_io = GoodputCheckpointIO(config)
        self.loader = TrackedLoader(loader) if loader is not None else None
        self._step = [0]
        self._faults: FaultPlan | None = None
        self._last_saved: int | None = None
        self._max_steps = -1
        self._epoch_started = False  # whether this fit ran an epoch-start hook (a mid-epoch resume runs none)
        self._exporters = list(exporters)
        # What verify-resume compares (only under GOODPUT_RECORDS): see goodput.run.records.
        self._records = StepRecorder.from_env(run_dir, rank=self.ledger.rank, attempt=self.ledger.attempt)

    @property
    def resume_path(self) -> str | None:
        """``ckpt_path`` for ``fit``: :data:`RESUME_PATH` when a committed checkpoint exists, else None.

        Committed checkpoints that all fail even the listing's checks also give :data:`RESUME_PATH`, so the
        restore stops the run (``NoValidCheckpoint``) rather than train from step 0 beside them, unless
        ``CheckpointConfig.fresh_start_allowed()``.
        """
        config = self.checkpoint_io.config
        rows = list_checkpoints(config.root, storage_options=config.storage_options)
        if any(r.status == "committed" for r in rows):
            return RESUME_PATH
        damaged = any(r.status == "corrupt" for r in rows)
        return RESUME_PATH if damaged and not config.fresh_start_allowed() else None

    # ---- Lightning hooks ------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        _check_strategy(trainer, self.checkpoint_io)
        self.checkpoint_io.attach(trainer, self.loader, self.ledger)
        self._faults = install_plan(
            self.run_dir,
            self.ledger,
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            step=self._step,
        )
        # goodput restores the loader itself; Lightning cannot see that and would warn it is not resumable
        warnings.filterwarnings(
            "ignore", message="You're resuming from a checkpoint that ended before the epoch"
        )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        manager = self.checkpoint_io.manager  # built now when no restore did it
        step = int(trainer.global_step)
        self._step[0], self._last_saved, self._max_steps = step, step, int(trainer.max_steps)
        self._epoch_started = False
        self.ledger.state_registered(["model", "optimizer", "data", "rng", "step", "lightning"])
        self.ledger.on_event(
            "checkpoint_config", strategy=manager.config.strategy, **interval_fields(manager.config)
        )
        self.ledger.init_done()
        self.ledger.step_start(step + 1)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._epoch_started = True

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not self._epoch_started:  # resumed mid-epoch: the progress bar has not seen the epoch start
            self._epoch_started = True
            show_epoch_start(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = int(trainer.global_step)
        self._step[0] = step
        loss = _loss(outputs)
        fetch = self.loader.take_wait() if self.loader is not None else 0.0
        if self.loader is not None:
            self.loader.step_trained()
        self.ledger.step_end(step, fetch_seconds=fetch, loss=loss)
        if self._records is not None:
            self._records.step(step, loaders=(self.loader,), loss=loss)
        if self._exporters:
            _export(self._exporters, step, self.ledger, fetch, loss)
        if self._faults is not None:
            self._faults.check(phase="step", step=step)
        # The last step is saved here, like any other: by ``on_train_end`` Lightning has counted the epoch as
        # ended, so a resume (with a larger max_steps) would number the rest of this epoch as the next one.
        if self.checkpoint_io.manager.should_save(step) or 0 <= self._max_steps <= step:
            self._save(trainer, step)
        if self._max_steps < 0 or step < self._max_steps:
            self.ledger.step_start(step + 1)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._last_saved != int(trainer.global_step):
            self._save(trainer, int(trainer.global_step))
        if self._records is not None:
            self._record_final(self._records, int(trainer.global_step))
        self.checkpoint_io.teardown()
        self._finish("ok")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.checkpoint_io.abandon(int(trainer.global_step))
        self._finish("failed")

    def state_dict(self) -> dict[str, Any]:
        return {}  # the callback's state (data position, RNG) lives in goodput's checkpoint

    # ---- internals ------------------------------------------------------------------------------------
    def _save(self, trainer: Any, step: int) -> None:
        # weights_only=False is Lightning's default; left unset, Lightning logs that it defaulted, every save
        trainer.save_checkpoint(f"{self.checkpoint_io.config.root}/step-{step}", weights_only=False)
        self._last_saved = step

    def _record_final(self, records: StepRecorder, step: int) -> None:
        """Record the final state for verify-resume, all of it but Lightning's loop counters.

        The counters count hook calls, and Lightning's own resume skips some (a run restored from the last
        batch of an epoch does not count the next epoch's start), so they differ after a resume that trained
        exactly the same; Lightning's epoch and global step are compared.
        """
        state = self.checkpoint_io.bound_state()
        saved = state.extras
        lightning = {k: v for k, v in saved.get("lightning", {}).items() if k != "loops"}
        state.extras = {**saved, "lightning": lightning}
        try:
            records.final(state, step)
        finally:
            state.extras = saved

    def _finish(self, status: str) -> None:
        if self._records is not None:
            self._records.close()
        for exporter in self._exporters:
            exporter.close()
        self.ledger.close(status)
        install_faults(None)


def _check_strategy(trainer: Any, io: GoodputCheckpointIO) -> None:
    """Refuse set-ups where saves would bypass goodput, run on rank 0 only (a collective would hang), or a
    restore would come before the optimizers exist (their state would be lost)."""
    if trainer.strategy.checkpoint_io is not io:
        raise ConfigError(
            "the Trainer does not save through goodput: pass "
            "strategy=GoodputDDPStrategy(checkpoint_io=goodput_cb.checkpoint_io) (one process too)"
        )
    if trainer.world_size > 1 and not isinstance(trainer.strategy, GoodputDDPStrategy):
        raise ConfigError(
            f"{type(trainer.strategy).__name__} saves on rank 0 only, but goodput saves on every rank: "
            "use strategy=GoodputDDPStrategy(checkpoint_io=goodput_cb.checkpoint_io)"
        )
    if not trainer.strategy.restore_checkpoint_after_setup:
        raise ConfigError(
            f"{type(trainer.strategy).__name__} restores a checkpoint before it creates the optimizers, so "
            "their state would be lost: use strategy=GoodputDDPStrategy(checkpoint_io=goodput_cb.checkpoint_io) "
            "(one process too)"
        )


def _bind(state: TrainingState, trainer: Any) -> None:
    """Point ``state`` at the trainer's model, optimizer, LR scheduler and gradient scaler as they are now."""
    optimizers = list(trainer.optimizers)
    schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
    if len(optimizers) > 1 or len(schedulers) > 1:
        raise ConfigError("GoodputCheckpointIO supports one optimizer and at most one LR scheduler")
    state.model = trainer.lightning_module
    state.optimizer = optimizers[0] if optimizers else None
    state.scheduler = schedulers[0] if schedulers else None
    state.scaler = getattr(trainer.precision_plugin, "scaler", None)


def _loss(outputs: Any) -> float | None:
    value: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
    try:
        return float(value.detach()) if hasattr(value, "detach") else None
    except (TypeError, ValueError, RuntimeError):
        return None


def _json_part(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Lightning's progress (epoch, step, loop counters, JSON-able callback states) as plain JSON values."""
    part: dict[str, Any] = {}
    for key in _LIGHTNING_KEYS:
        if key not in checkpoint:
            continue
        value = checkpoint[key]
        if key == "callbacks":
            value = {name: s for name, s in value.items() if _is_json(s)}
        elif not _is_json(value):
            raise ConfigError(
                f"Lightning's checkpoint entry {key!r} is not JSON-able; goodput cannot store it"
            )
        part[key] = value
    return part


def _is_json(value: Any) -> bool:
    try:
        return json.loads(json.dumps(value)) == value
    except (TypeError, ValueError):
        return False
