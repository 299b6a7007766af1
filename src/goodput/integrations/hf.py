"""Hugging Face ``Trainer``: goodput's ledger and an O(1) data resume (``pip install 'goodput[hf]'``).

    loader = gp.ResumableLoader(train_dataset, batch_size=8, seed=0, collate_fn=default_data_collator)
    trainer = GoodputTrainer(model=model, args=TrainingArguments("runs/hf1/out", save_steps=50, ...),
                             goodput_loader=loader)        # run folder: $GOODPUT_RUN_DIR or run_dir=
    trainer.train(resume_from_checkpoint=trainer.resume_path)

* :class:`GoodputTrainerCallback` writes the ledger from the Trainer's hooks (steps, each step's wait for data,
  checkpoint stalls, the restored step, attempts) and fires goodput's fault plan (``$GOODPUT_FAULTS``; its
  ``checkpoint_write`` fires after the Trainer wrote a checkpoint and before goodput's data position is beside
  it, ``restore`` while the position is restored), so ``goodput report`` and ``goodput launch --faults`` work
  on a Trainer run. Under ``goodput verify-resume`` it records each step (with :class:`GoodputTrainer`, its
  loss too) and the final state as ``goodput.Run`` does.
* Resume without replaying data: on resume the Trainer's own code fast-forwards its dataloader through every
  batch of the epoch already trained (accelerate's ``skip_first_batches``), a cost that grows with the resume
  point. :class:`GoodputTrainer` trains from a :class:`~goodput.data.ResumableLoader` instead, stores the data
  position beside each checkpoint (``goodput-data-rank<r>.json``) and restores it in O(1); it sets
  ``ignore_data_skip`` so the Trainer skips nothing itself.

With several ranks, build the loader after ``TrainingArguments`` (which joins the process group), or pass it
``rank=`` and ``world_size=``, so that each rank reads its own share.

The Trainer saves synchronously and calls ``on_save`` after writing: the callback records the stall from the
end of the step that triggered the save to ``on_save``, and the checkpoint as durable then. The restore
happens inside ``train()`` before the first hook: under :class:`GoodputTrainer` the report's
``checkpoint_restore`` runs from the Trainer's model load to that hook (the optimizer and scheduler loads, and
accelerate's preparation between them); under the plain callback the restore is initialisation. Either way the
restore is recorded (``checkpoint_restored``, from the durable tier) for the report's restores line.

transformers is imported when this module is; ``import goodput`` never imports it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

from transformers import Trainer, TrainerCallback

from goodput._env import RUN_DIR
from goodput.checkpoint import TrainingState
from goodput.checkpoint._trainer_folders import DATA_FILE, resumable_trainer_checkpoint
from goodput.errors import ConfigError
from goodput.faults import FaultPlan, install_faults
from goodput.integrations._faults import export as _export
from goodput.integrations._faults import install_plan
from goodput.integrations._tracked import TrackedLoader
from goodput.ledger.exporters import MetricsExporter
from goodput.ledger.ledger import Ledger
from goodput.run.records import StepRecorder

__all__ = ["GoodputTrainer", "GoodputTrainerCallback"]


class GoodputTrainerCallback(TrainerCallback):
    """Ledger and fault plan for a Hugging Face ``Trainer``; with ``loader``, the data position too.

    Args:
        run_dir: the run folder (ledger, fault markers). None: ``$GOODPUT_RUN_DIR``.
        loader: a :class:`~goodput.data.ResumableLoader` the Trainer trains from (see :class:`GoodputTrainer`).
        exporters: receive each step's live goodput and fetch time (e.g. ``PrometheusExporter``).
    """

    def __init__(
        self, run_dir: str | None = None, *, loader: Any = None, exporters: Sequence[MetricsExporter] = ()
    ) -> None:
        run_dir = run_dir or RUN_DIR.get() or None
        if not run_dir:
            raise ConfigError(
                "GoodputTrainerCallback needs a run folder: pass run_dir or set GOODPUT_RUN_DIR"
            )
        self.run_dir = run_dir
        self.ledger = Ledger(run_dir)  # first, so the attempt's time counts from process start
        self.rank = self.ledger.rank
        self.loader = TrackedLoader(loader) if loader is not None else None
        self._step = [0]
        self._faults: FaultPlan | None = None
        self._stall_start: float | None = None
        self._accumulation = 1
        self._max_steps = -1
        self._restore_began: float | None = None  # when GoodputTrainer saw the Trainer start loading
        self._exporters = list(exporters)
        # What verify-resume compares (only under GOODPUT_RECORDS): see goodput.run.records.
        self._records = StepRecorder.from_env(run_dir, rank=self.rank, attempt=self.ledger.attempt)
        self._loss: float | None = None  # the current step's loss, summed over its micro-batches

    def add_loss(self, loss: Any) -> None:
        """Count a micro-batch's loss into the step's (read only when verify-resume records the run)."""
        if self._records is not None:
            self._loss = (self._loss or 0.0) + float(loss)

    def restore_began(self) -> None:
        """The Trainer begins loading a checkpoint (:class:`GoodputTrainer` sees it; a plain Trainer's restore
        is over by the first hook, so it counts from there)."""
        self._restore_began = time.monotonic()
        self.ledger.restore_start()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        self._step[0], self._accumulation, self._max_steps = (
            step,
            int(args.gradient_accumulation_steps),
            state.max_steps,
        )
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self._faults = install_plan(
            self.run_dir, self.ledger, rank=self.rank, world_size=world, step=self._step
        )
        if step > 0:  # the Trainer restored a checkpoint before this hook
            if self._restore_began is None:
                self.restore_began()
            self._faults.check(phase="restore", step=step)
            self._load_position(os.path.join(args.output_dir, f"checkpoint-{step}"))
            assert self._restore_began is not None
            seconds = time.monotonic() - self._restore_began
            self.ledger.event(
                "checkpoint_restored", step=step, tier="durable", source="hf_trainer", seconds=seconds
            )
            self.ledger.restore_end(step)
        keys = ["model", "optimizer", "scheduler", "rng", "step"] + (
            ["data"] if self.loader is not None else []
        )
        self.ledger.state_registered(keys)
        self.ledger.on_event("checkpoint_config", strategy="hf_trainer", every_steps=int(args.save_steps))
        self.ledger.init_done()
        self.ledger.step_start(step + 1)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        self._step[0] = step
        fetch = 0.0
        if self.loader is not None:
            fetch = self.loader.take_wait()
            self.loader.step_trained(self._accumulation)
        self.ledger.step_end(step, fetch_seconds=fetch)
        if self._records is not None:
            self._records.step(step, loaders=(self.loader,), loss=self._loss)
        self._loss = None
        if self._exporters:
            _export(self._exporters, step, self.ledger, fetch, None)
        if self._faults is not None:
            self._faults.check(phase="step", step=step)
        if control.should_save:  # DefaultFlowCallback decided before this hook; the save follows it
            self._stall_start = time.monotonic()
            self.ledger.on_event("checkpoint_stall", phase="start", step=step)
        elif self._max_steps <= 0 or step < self._max_steps:
            self.ledger.step_start(step + 1)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        folder = os.path.join(args.output_dir, f"checkpoint-{step}")
        if self._faults is not None:  # the Trainer's files are written, goodput's position not yet
            self._faults.check(phase="checkpoint_write", step=step)
        if self.loader is not None:
            _write_json(os.path.join(folder, DATA_FILE.format(rank=self.rank)), self.loader.state_dict())
        if self._stall_start is not None:
            stall = time.monotonic() - self._stall_start
            self._stall_start = None
            self.ledger.on_event("checkpoint_stall", phase="end", step=step, seconds=stall)
            self.ledger.on_event(
                "checkpoint_durable", step=step, stall_seconds=stall, persist_seconds=stall, url=folder
            )
            if self._max_steps <= 0 or step < self._max_steps:
                self.ledger.step_start(step + 1)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._records is not None:
            self._records.final(
                _final_state(kwargs, self.loader, int(state.global_step)), int(state.global_step)
            )
            self._records.close()
        for exporter in self._exporters:
            exporter.close()
        self.ledger.close("ok")
        install_faults(None)

    def _load_position(self, folder: str) -> None:
        if self.loader is None:
            return
        path = os.path.join(folder, DATA_FILE.format(rank=self.rank))
        try:
            with open(path) as f:
                position = json.load(f)
        except FileNotFoundError:
            raise ConfigError(
                f"{folder} holds no data position ({os.path.basename(path)}): it was not saved by GoodputTrainer; "
                "resume it with the Trainer's own loader, or start a new output_dir"
            ) from None
        self.loader.load_state_dict(position)


class GoodputTrainer(Trainer):
    """A ``Trainer`` that trains from a :class:`~goodput.data.ResumableLoader` and resumes it in O(1).

    Args:
        goodput_loader: the loader of the training data (its ``batch_size`` is per device).
        run_dir: the run folder for the ledger (None: ``$GOODPUT_RUN_DIR``).
        exporters: receive each step's live goodput and fetch time (e.g. ``PrometheusExporter``).
        *args, **kwargs: the Trainer's own.
    """

    def __init__(
        self,
        *args: Any,
        goodput_loader: Any,
        run_dir: str | None = None,
        exporters: Sequence[MetricsExporter] = (),
        **kwargs: Any,
    ) -> None:
        self.goodput_callback = GoodputTrainerCallback(run_dir, loader=goodput_loader, exporters=exporters)
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), self.goodput_callback]
        super().__init__(*args, **kwargs)
        self.args.ignore_data_skip = True  # the position is restored by goodput, not by replaying batches

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """The restore's span in the ledger opens as the Trainer starts loading the model."""
        self.goodput_callback.restore_began()
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.goodput_callback.add_loss(loss)
        return loss

    def get_train_dataloader(self) -> Any:
        assert self.goodput_callback.loader is not None
        return self.goodput_callback.loader

    @property
    def resume_path(self) -> str | None:
        """The newest ``checkpoint-N`` folder in ``output_dir`` that the Trainer finished and where every rank
        wrote goodput's data position (None: none), the same folder on every rank."""
        folder = self.args.output_dir
        if not folder:
            return None
        return resumable_trainer_checkpoint(folder, self.goodput_callback.rank)


def _final_state(hook_kwargs: dict[str, Any], loader: TrackedLoader | None, step: int) -> TrainingState:
    """The Trainer's model, optimizer and scheduler (unwrapped from accelerate's), the RNG and data position."""
    optimizer = hook_kwargs.get("optimizer")
    scheduler = hook_kwargs.get("lr_scheduler")
    state = TrainingState(
        model=hook_kwargs.get("model"),
        optimizer=getattr(optimizer, "optimizer", optimizer),
        scheduler=getattr(scheduler, "scheduler", scheduler),
        loader=loader,
    )
    state.step = step
    return state


def _write_json(path: str, value: Any) -> None:
    """Write ``value`` as JSON atomically: a crash leaves the old file or the new one, never half of one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
