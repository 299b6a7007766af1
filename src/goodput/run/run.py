"""``Run``: the few lines that make an ordinary PyTorch loop survive failures.

    run = Run("runs/exp1", checkpoint=CheckpointConfig(root="runs/exp1/checkpoints", every="auto"))
    loader = ResumableLoader(dataset, batch_size=32, seed=0)
    run.restore(model=model, optimizer=opt, scheduler=sched, loader=loader)
    for batch in run.batches(loader, steps=10_000):
        loss = model(batch).mean(); loss.backward(); opt.step(); opt.zero_grad()
        run.step_done(loss=loss.item())
    run.close()

Run owns the order of a step: it joins the process group in this attempt's store namespace, writes the ledger,
restores the newest valid checkpoint, times each batch's fetch, fires injected faults, stops on preemption and
saves when the policy says so. What watches or adjusts a run (watchdog, crash loops, progress, records, cache
counters, numeric guard, stragglers, warm restarts) is a hook in ``run.hooks``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any

from goodput._env import FAULTS, STOP_AFTER
from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState
from goodput.distributed import dist_info
from goodput.errors import ConfigError, SaveFailed
from goodput.faults import install_faults
from goodput.launch.folder import install_error_report, register_pid
from goodput.ledger.exporters import MetricsExporter
from goodput.ledger.ledger import Ledger
from goodput.run._attempt import agreed_attempt
from goodput.run._batches import BatchLoop
from goodput.run._observers import WatchdogHook, builtin_hooks
from goodput.run._runhooks import (
    already_complete,
    arm_faults,
    check_train_fn,
    checked_numeric,
    checked_plan,
    checkpoint_config,
    exit_preempted,
    join_group,
    observe_failures,
    record_state,
    report_preempted,
    resolve_run_dir,
)
from goodput.run._warm import WarmHook, exit_failed
from goodput.run.hooks import RunHook
from goodput.run.numeric import NumericConfig
from goodput.run.signals import PreemptionWatch, end_with_launcher
from goodput.run.stragglers import StragglerConfig, StragglerHook, attach_stragglers
from goodput.run.watchdog import Watchdog
from goodput.warm.boot import release as release_gc
from goodput.warm.worker import is_peer_failure

__all__ = ["Run"]


class Run:
    """One attempt of a training run: restore, iterate, save, account, and finish cleanly.

    Args:
        run_dir: the run folder (local): ledger, attempt records, fault markers, and by default the
            checkpoints. None: ``$GOODPUT_RUN_DIR`` (set by ``goodput launch --run-dir``). A run has one
            folder: a different one here than the launcher's is a ConfigError.
        checkpoint: where, how and how often to checkpoint (default: ``dcp_async`` every ``auto`` interval
            under ``run_dir/checkpoints``).
        total_steps: the run's length, for the progress line and ``batches()``.
        backend: process-group backend (None: nccl with CUDA, else gloo).
        hang_timeout: seconds without a step before this rank counts as hung and is ended so torchrun
            restarts the group (4x longer inside checkpoint save/restore); None disables the watchdog.
        faults: a fault plan (see goodput.faults); None reads ``$GOODPUT_FAULTS``.
        crash_loop: attempts without progress that stop the job; None reads ``$GOODPUT_CRASH_LOOP`` (3).
        progress: draw the progress line on rank 0.
        exporters: receive each step's live goodput, fetch time and loss (e.g. ``PrometheusExporter``); closed
            with the run.
        numeric: the numeric guard (NaN/Inf, loss spikes, corrupted replicas; roll back in place, skip the bad
            data, stop bounded; see ``goodput.run.numeric``): off by default (docs/numeric-faults.md says why);
            ``True`` (``gp.NumericConfig()``) or a ``gp.NumericConfig(...)`` turns it on.
        stragglers: the straggler detector (each rank's own time vs its wait for the others, scores, an alarm;
            docs/stragglers.md): ``gp.StragglerConfig()`` turns it on.

    Preemption: the signal ``$GOODPUT_PREEMPT_SIGNAL`` (USR1 by default; ``goodput launch`` forwards SIGTERM
    and SIGINT as it) makes every rank finish its step, agree on the step (``goodput.run.signals``), save it
    durably and exit (0 under ``goodput launch``, which then exits ``EXIT_PREEMPTED``; else EXIT_PREEMPTED).
    Without torchrun (``python train.py``) Run is a single rank with no process group.
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
        exporters: Sequence[MetricsExporter] = (),
        numeric: NumericConfig | bool = False,
        stragglers: StragglerConfig | None = None,
    ) -> None:
        install_error_report(int(os.environ.get("RANK", "0")))
        run_dir = resolve_run_dir(run_dir)
        if total_steps is not None and total_steps < 1:
            raise ConfigError(f"total_steps must be >= 1, got {total_steps}")
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.step = 0
        worker, self.info, self._owns_group = join_group(backend, step_of=lambda: self.step)
        self.warm_hook = WarmHook(worker) if worker is not None else None
        self._preempt = PreemptionWatch(rank=self.info.rank, world_size=self.info.world_size)
        register_pid(self.info.rank)
        end_with_launcher()  # this process ends with its parent under goodput launch (also when not booted by it)
        # One numbering for the job: every rank of this round records the same attempt (see _attempt).
        attempt = None if worker is not None else agreed_attempt(run_dir)
        self.ledger = Ledger(
            run_dir, rank=self.info.rank, attempt=attempt, began=worker.began if worker else None
        )
        self.attempt = self.ledger.attempt
        self._plan_text = faults if faults is not None else FAULTS.get()
        guard = checked_numeric(numeric)
        plan = checked_plan(self._plan_text, self.info.world_size, total_steps, numeric_on=guard is not None)
        self.faults = arm_faults(self, self._plan_text)
        self.config = checkpoint_config(checkpoint, run_dir)
        self._manager: CheckpointManager | None = None
        self.loader: Any = None  # the loader ``batches`` reads
        self.fetch_seconds = 0.0  # the last step's wait for its batch
        self._loop = BatchLoop()  # the iteration state of ``batches``
        self._last_saved: int | None = None
        self._closed = False
        self.hooks: list[RunHook] = builtin_hooks(
            self,
            plan=plan,
            crash_loop=crash_loop,
            progress=progress,
            exporters=exporters,
            numeric=guard,
        )
        self.watchdog = Watchdog(hang_timeout, on_hang=self._hung) if hang_timeout else None
        if self.watchdog is not None:  # first: a finished step is a heartbeat before any hook works on it
            self.hooks.insert(0, WatchdogHook(self.watchdog))
        self._stragglers = attach_stragglers(self, stragglers, exporters=exporters)
        if self._stragglers is not None:
            self.hooks.append(StragglerHook(self._stragglers))

    def add_hook(self, hook: RunHook) -> None:
        """Append ``hook`` to ``run.hooks`` (called after the built-in ones at every moment; see ``RunHook``)."""
        self.hooks.append(hook)

    @property
    def manager(self) -> CheckpointManager:
        """The checkpoint manager (after ``restore``)."""
        if self._manager is None:
            raise ConfigError("call run.restore(model=..., ...) before training")
        return self._manager

    @property
    def state(self) -> TrainingState | None:
        """The training state given to ``restore`` (None before it, and between generations)."""
        return self._manager.state if self._manager is not None else None

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
        self.ledger.restore_start()
        with self.phase("restore"):  # the manager's first look at the store is part of restoring, too
            self._manager = CheckpointManager(  # to the ledger of the moment (a rollback opens a new attempt)
                self.config, state, on_event=lambda name, **fields: self.ledger.on_event(name, **fields)
            )
            observe_failures(self._manager, self.run_dir, attempt=self.attempt, rank=self.info.rank)
            if self._stragglers is not None:  # its DDP comm hook goes on before any other part's
                self._stragglers.attach(model)
            self.loader = loader
            step = None
            for hook in self.hooks:
                step = hook.before_restore(self, state)
                if step is not None:
                    break
            if step is None:
                step = self._manager.restore_latest()
        self.ledger.restore_end(step)
        record_state(self.ledger, state, self.config)
        self.step = step or 0
        self._last_saved = step
        self._preempt.start(self.step)
        already_complete(self)
        self.ledger.init_done()
        release_gc()  # the collector's thresholds back, the set-up's objects frozen (goodput.warm.boot)
        for hook in self.hooks:
            hook.on_restore(self, state, step)
        return step

    def batches(
        self, loader: Any = None, *, steps: int | None = None, ahead: bool | None = None
    ) -> Iterator[Any]:
        """The loader's batches, epoch after epoch, until ``steps`` (default ``total_steps``) are done.

        Each batch's wait counts as fetch time in the ledger. Call ``step_done()`` after each step.

        ``ahead``: receive the next batch in a background thread while the step computes, so the loop finds it
        ready (``DevicePrefetcher``'s CPU path). None (the default) turns it on for a ``ResumableLoader`` whose
        batches come from worker processes: the thread then only receives them (no dataset, collate or RNG
        code of yours runs in it). A batch received but not handed out is not consumed: the loader's position,
        and so a checkpoint's, counts the batches the loop got. Any other loader gets the thread only with
        ``ahead=True`` (its sampler then runs in it), and not when it was given to ``restore``: its own
        ``state_dict()`` would count the batch received ahead (a ConfigError says so).
        """
        loader = loader if loader is not None else self.loader
        if loader is None:
            raise ConfigError("batches() needs a loader (or one given to restore())")
        yield from self._loop.batches(self, loader, steps if steps is not None else self.total_steps, ahead)

    def step_done(self, *, loss: float | None = None) -> None:
        """Mark the step finished: record it, fire due faults, and save when the policy says so."""
        manager = self.manager
        self.faults.stretch()  # a persistent slow fault makes this step longer (a straggler drill)
        self.step += 1
        step = self.step
        for hook in self.hooks:
            loss = hook.adjust_loss(self, step, loss)
        self.fetch_seconds = getattr(self.loader, "last_fetch_seconds", 0.0) or 0.0
        self.ledger.step_end(step, fetch_seconds=self.fetch_seconds, loss=loss)
        for hook in self.hooks:
            if hook.on_step(self, step, loss):
                self._loop.rewound = True
                return  # rolled back in place, to an earlier step: batches() goes on from there
        self.faults.check(phase="step", step=self.step)
        if self._preempt.should_stop(self.step):
            self._stop_preempted(self._preempt.requested or "a signal")
        if STOP_AFTER.get() == str(self.step):  # verify-resume's reference: one part of a world-size schedule
            self.close()
            raise SystemExit(0)
        durable = manager.should_save(self.step)
        if manager.should_save_memory(self.step):
            with self.phase("checkpoint_save"):
                manager.save_memory(self.step)
        if durable:
            with contextlib.suppress(SaveFailed):  # logged and in the ledger: train on, save again later
                self.save()

    def section(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Time a named part of the step for the straggler detector (a no-op when it is off)."""
        return self._stragglers.section(name) if self._stragglers is not None else contextlib.nullcontext()

    def save(self) -> None:
        """Save the current step now (blocking only for the strategy's blocking part)."""
        manager = self.manager
        manager.state.step = self.step
        with self.phase("checkpoint_save"):
            manager.save(self.step)
        self._last_saved = self.step

    def close(self) -> None:
        """Save the final step if it is not saved yet, wait until it is durable, and end the attempt."""
        self._close("ok")

    def _close(self, status: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.stop()
        try:
            if self._manager is not None:
                if status == "ok":
                    self._loop.loop_end_rewound(self, closing=True)
                if self._last_saved != self.step:
                    self.save()
                with self.phase("checkpoint_save"):
                    self._manager.close()
            for hook in self.hooks:
                hook.on_finish(self)
        finally:
            self._shutdown(status)

    def _shutdown(self, status: str) -> None:
        for hook in reversed(self.hooks):
            hook.on_close(self, status)
        self.ledger.close(status)
        self._preempt.close()
        install_faults(None)
        if self._owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def _stop_preempted(self, why: str) -> None:
        """Save the current step durably on every rank, report it, close the run and end the process."""
        if self._last_saved != self.step:
            self.save()
        with self.phase("checkpoint_save"):
            result = self.manager.wait()
        url = report_preempted(self, result, why)
        self._close("interrupted")
        exit_preempted(self, url, why)

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

    def warm(self, train_fn: Callable[[Run], Any]) -> Any:
        """Run ``train_fn(self)``; under warm restarts, re-enter it in this process after another rank fails.

        ``train_fn`` holds the ordinary loop (build, ``restore``, ``batches``, ``step_done``, ``close``). After a
        peer's failure it is called again in the same process: it must rebuild whatever is bound to the dead
        process group (DDP/FSDP wrappers, optimizer, LR scheduler, loader and its iterator); ``restore`` then
        fills them from a surviving replica (or the newest checkpoint). Module-level state (imports, compiled
        kernels, datasets and caches) may be reused. Without warm restarts it simply calls ``train_fn`` once.

        Raises:
            ConfigError: when ``train_fn`` cannot take the run as its one argument (``def train():``).
        """
        check_train_fn(train_fn)
        while True:
            try:
                return train_fn(self)
            except Exception as err:
                self._loop.stop()
                if self.warm_hook is None:
                    raise
                if not is_peer_failure(err):
                    exit_failed(self, err)
                self._warm_restart(err)

    def _warm_restart(self, err: BaseException) -> None:
        """Leave the failed generation keeping this process and its state, and join the next one."""
        assert self.warm_hook is not None
        self.end_attempt(f"peer failure: {str(err).splitlines()[0][:200] if str(err) else err!r}")
        self.warm_hook.snapshot(self)
        self._manager = None  # bound to the dead group; a save in flight there is abandoned
        self._preempt.leave_group()  # its group belongs to the dead generation; a preemption request stays
        with self.phase("restore"):
            self.warm_hook.leave()
        self.info = dist_info()  # a shrink or grow renumbers the ranks
        self._preempt.rank, self._preempt.world_size = self.info.rank, self.info.world_size
        # Every rank of the new generation makes the watch's group at the same point as a spare does in __init__.
        self._preempt.join_group()
        self.begin_attempt("warm", began=self.warm_hook.worker.joined_wall)
        self._closed = False
        self.faults = arm_faults(self, self._plan_text)

    def end_attempt(self, failure: str) -> None:
        """Record ``failure`` and close this attempt's ledger (a warm restart or a rollback follows)."""
        self.ledger.failure_detected(failure)
        self.ledger.close("failed")

    def begin_attempt(self, kind: str, *, began: float) -> None:
        """Open a new ledger attempt in this process (``kind``: ``"warm"`` or ``"rollback"``) and tell the hooks."""
        self.ledger = Ledger(self.run_dir, rank=self.info.rank, began=began)
        self.attempt = self.ledger.attempt
        for hook in self.hooks:
            hook.on_attempt(self, kind)

    def rewind(self, step: int) -> None:
        """The state was restored in place to ``step`` (a rollback): go on from there, ``step`` being saved."""
        self.step = step
        self._last_saved = step

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A stretch the watchdog allows longer than a step (``restore``, ``checkpoint_save``)."""
        return self.watchdog.phase(name) if self.watchdog is not None else contextlib.nullcontext()

    def _hung(self, silent: float, phase: str | None) -> None:
        self.ledger.failure_detected("hang" + (f" in {phase}" if phase else ""), silent_seconds=silent)
        self.ledger.close("failed")
