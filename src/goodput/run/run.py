"""``Run``: the few lines that make an ordinary PyTorch loop survive failures.

    run = Run("runs/exp1", checkpoint=CheckpointConfig(root="runs/exp1/checkpoints", every="auto"))
    loader = ResumableLoader(dataset, batch_size=32, seed=0)
    run.restore(model=model, optimizer=opt, scheduler=sched, loader=loader)
    for batch in run.batches(loader, steps=10_000):
        loss = model(batch).mean(); loss.backward(); opt.step(); opt.zero_grad()
        run.step_done(loss=loss.item())
    run.close()

Run is the one place that knows every part: it joins the process group in a store namespace of this attempt
(reliable torchrun restarts), writes the ledger, restores the newest valid checkpoint, counts each batch's
fetch time, saves when the policy says so, watches for hangs and crash loops, fires injected faults, and draws
the progress line. It works in one process and under torchrun (``goodput launch``), with plain, DDP and FSDP2
models.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from goodput.checkpoint import AutoInterval, CheckpointConfig, CheckpointManager, TrainingState
from goodput.distributed import init_distributed
from goodput.errors import ConfigError, DataError
from goodput.faults import Fault, FaultPlan, install_faults, parse_faults
from goodput.ledger.accounting import account
from goodput.ledger.ledger import Ledger, read_events
from goodput.run.crashloop import CrashLoopDetector
from goodput.run.progress import Progress
from goodput.run.watchdog import Watchdog

__all__ = ["Run"]

RUN_DIR_ENV = "GOODPUT_RUN_DIR"


class Run:
    """One attempt of a training run: restore, iterate, save, account, and finish cleanly.

    Args:
        run_dir: the run folder (local): ledger, attempt records, fault markers, and by default the
            checkpoints. None: ``$GOODPUT_RUN_DIR`` (set by ``goodput launch``).
        checkpoint: where, how and how often to checkpoint (default: ``dcp_async`` every ``auto`` interval
            under ``run_dir/checkpoints``).
        total_steps: the run's length, for the progress line and ``batches()``.
        backend: process-group backend (None: nccl with CUDA, else gloo).
        hang_timeout: seconds without a step before this rank counts as hung and is ended so torchrun
            restarts the group (4x longer inside checkpoint save/restore); None disables the watchdog.
        faults: a fault plan (see goodput.faults); None reads ``$GOODPUT_FAULTS``.
        crash_loop: attempts without progress that stop the job; None reads ``$GOODPUT_CRASH_LOOP`` (3).
        progress: draw the progress line on rank 0.
    """

    def __init__(
        self,
        run_dir: str | None = None,
        *,
        checkpoint: CheckpointConfig | None = None,
        total_steps: int | None = None,
        backend: str | None = None,
        hang_timeout: float | None = 300.0,
        faults: str | None = None,
        crash_loop: int | None = None,
        progress: bool = True,
    ) -> None:
        run_dir = run_dir or os.environ.get(RUN_DIR_ENV)
        if not run_dir:
            raise ConfigError(f"Run needs a run folder: pass run_dir or set {RUN_DIR_ENV}")
        if total_steps is not None and total_steps < 1:
            raise ConfigError(f"total_steps must be >= 1, got {total_steps}")
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.info = init_distributed(backend)
        self._owns_group = self.info.world_size > 1
        self.ledger = Ledger(run_dir, rank=self.info.rank)
        self.attempt = self.ledger.attempt
        plan_text = faults if faults is not None else os.environ.get("GOODPUT_FAULTS", "")
        self.faults = FaultPlan(
            parse_faults(plan_text),
            rank=self.info.rank,
            world_size=self.info.world_size,
            attempt=self.attempt,
            marker_dir=os.path.join(run_dir, "faults"),
            on_fire=self._fault_fired,
        )
        install_faults(self.faults)
        self._node_loss_planned = any(f.action == "nodeloss" for f in parse_faults(plan_text))
        limit = crash_loop if crash_loop is not None else int(os.environ.get("GOODPUT_CRASH_LOOP", "3"))
        self._crash = CrashLoopDetector(run_dir, self.attempt, limit=limit) if self.info.rank == 0 else None
        if self._crash is not None:
            self._crash.check()
        self.watchdog = Watchdog(hang_timeout, on_hang=self._hung) if hang_timeout else None
        self.config = checkpoint or CheckpointConfig(root=os.path.join(run_dir, "checkpoints"))
        self._progress_on = progress
        self._progress: Progress | None = None
        self._manager: CheckpointManager | None = None
        self._loader: Any = None
        self._last_saved: int | None = None
        self._closed = False
        self.step = 0

    @property
    def manager(self) -> CheckpointManager:
        """The checkpoint manager (after ``restore``)."""
        if self._manager is None:
            raise ConfigError("call run.restore(model=..., ...) before training")
        return self._manager

    def restore(
        self,
        *,
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        loader: Any = None,
        extras: dict[str, Any] | None = None,
    ) -> int | None:
        """Register the training state and load the newest valid checkpoint into it.

        Returns:
            The restored step, or None when the run starts from scratch.
        """
        state = TrainingState(
            model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, loader=loader, extras=extras
        )
        self._manager = CheckpointManager(self.config, state, on_event=self.ledger.on_event)
        self._observe_failures(self._manager)
        self._loader = loader
        self.ledger.restore_start()
        with self._phase("restore"):
            if self._node_loss_planned:
                self._replace_lost_node(self._manager)
            step = self._manager.restore_latest()
        self.ledger.restore_end(step)
        parts = {
            "model": model,
            "optimizer": optimizer,
            "scheduler": scheduler,
            "scaler": scaler,
            "data": loader,
        }
        self.ledger.state_registered([k for k, v in parts.items() if v is not None] + ["rng", "step"])
        self.ledger.on_event(
            "checkpoint_config", strategy=self.config.strategy, **_interval_fields(self.config)
        )
        if self._crash is not None:
            self._crash.start(step)
        self.step = step or 0
        self._last_saved = step
        self.ledger.init_done()
        if self._progress_on:
            self._progress = Progress(total=self.total_steps, ledger=self.ledger, initial=self.step)
        return step

    def batches(self, loader: Any = None, *, steps: int | None = None) -> Iterator[Any]:
        """The loader's batches, epoch after epoch, until ``steps`` (default ``total_steps``) are done.

        Each batch's wait counts as fetch time in the ledger. Call ``step_done()`` after each step.
        """
        loader = loader if loader is not None else self._loader
        if loader is None:
            raise ConfigError("batches() needs a loader (or one given to restore())")
        self._loader = loader
        steps = steps if steps is not None else self.total_steps
        iterator = iter(loader)
        pending = False  # a step_start was recorded and its batch not yet handed out
        empty_epochs = 0
        while steps is None or self.step < steps:
            if not pending:
                self.ledger.step_start(self.step + 1)
                pending = True
            try:
                batch = next(iterator)
            except StopIteration:
                empty_epochs += 1
                if empty_epochs > 1:
                    raise DataError(
                        "the loader yields no batches: is the dataset smaller than a batch?"
                    ) from None
                iterator = iter(loader)  # the next epoch
                continue
            empty_epochs, pending = 0, False
            yield batch

    def step_done(self, *, loss: float | None = None) -> None:
        """Mark the step finished: record it, fire due faults, and save when the policy says so."""
        manager = self.manager
        self.step += 1
        fetch = getattr(self._loader, "last_fetch_seconds", 0.0) or 0.0
        self.ledger.step_end(self.step, fetch_seconds=fetch, loss=loss)
        if self.watchdog is not None:
            self.watchdog.beat()
        if self._crash is not None:
            self._crash.progress(self.step)
        if self._progress is not None:
            self._progress.update(self.step, loss=loss, fetch_seconds=fetch)
        self.faults.check(phase="step", step=self.step)
        durable = manager.should_save(self.step)
        if manager.should_save_memory(self.step):
            with self._phase("checkpoint_save"):
                manager.save_memory(self.step)
        if durable:
            self.save()

    def save(self) -> None:
        """Save the current step now (blocking only for the strategy's blocking part)."""
        manager = self.manager
        manager.state.step = self.step
        with self._phase("checkpoint_save"):
            manager.save(self.step)
        self._last_saved = self.step

    def close(self) -> None:
        """Save the final step if it is not saved yet, wait until it is durable, and end the attempt."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._manager is not None:
                if self._last_saved != self.step:
                    self.save()
                with self._phase("checkpoint_save"):
                    self._manager.close()
            if self._crash is not None:
                self._crash.close()
        finally:
            self._shutdown("ok")

    def _shutdown(self, status: str) -> None:
        if self._progress is not None:
            self._progress.close()
        self.ledger.close(status)
        if self.watchdog is not None:
            self.watchdog.close()
        install_faults(None)
        if self._owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        elif not self._closed:
            self._closed = True
            self._shutdown("failed")

    def _observe_failures(self, manager: CheckpointManager) -> None:
        """Feed the failure rate observed by earlier attempts of this run to the ``auto`` interval."""
        if not isinstance(manager.policy, AutoInterval) or self.attempt == 0 or self.info.rank != 0:
            return  # rank 0 decides time-based saves for every rank
        mtbf = account(read_events(self.run_dir)).mtbf_seconds
        if mtbf is not None:
            manager.policy.observe_mtbf(mtbf)
            if isinstance(manager.memory_policy, AutoInterval):
                manager.memory_policy.observe_mtbf(mtbf)

    def _replace_lost_node(self, manager: CheckpointManager) -> None:
        """After a ``nodeloss`` fault, this node comes back as a fresh machine: its memory tier is emptied
        (by its local rank 0, between two barriers so no rank of the job reads it meanwhile)."""
        import torch.distributed as dist

        request = os.path.join(self.run_dir, "faults", f"lost-node-{self.faults.node}")
        lost = os.path.exists(request)
        if dist.is_initialized():
            dist.barrier()
        if lost and manager.memory is not None and self.info.local_rank == 0:
            manager.memory.store.wipe_node()
            os.remove(request)
        if dist.is_initialized():
            dist.barrier()

    def _phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self.watchdog.phase(name) if self.watchdog is not None else contextlib.nullcontext()

    def _fault_fired(self, fault: Fault, where: str) -> None:
        self.ledger.event("fault_injected", action=fault.action, where=where, step=self.step)
        if (
            fault.action == "nodeloss"
        ):  # the next attempt wipes this node's RAM tier, as a new machine has none
            with open(os.path.join(self.run_dir, "faults", f"lost-node-{self.faults.node}"), "w"):
                pass
        if fault.action in ("kill", "hang", "nodeloss"):
            self.ledger.flush()  # the process is about to die or stop: keep the record

    def _hung(self, silent: float, phase: str | None) -> None:
        self.ledger.failure_detected("hang" + (f" in {phase}" if phase else ""), silent_seconds=silent)
        self.ledger.close("failed")


def _interval_fields(config: CheckpointConfig) -> dict[str, Any]:
    if config.every_steps is not None:
        return {"every_steps": config.every_steps}
    if config.every_seconds is not None:
        return {"interval_seconds": config.every_seconds}
    return {}
