"""``Run``: the few lines that make an ordinary PyTorch loop survive failures.

    run = Run("runs/exp1", checkpoint=CheckpointConfig(root="runs/exp1/checkpoints", every="auto"))
    loader = ResumableLoader(dataset, batch_size=32, seed=0)
    run.restore(model=model, optimizer=opt, scheduler=sched, loader=loader)
    for batch in run.batches(loader, steps=10_000):
        loss = model(batch).mean(); loss.backward(); opt.step(); opt.zero_grad()
        run.step_done(loss=loss.item())
    run.close()

Run owns the order of a step: it writes the ledger, restores the newest valid checkpoint, times each batch's
fetch, fires injected faults, stops on preemption and saves when the policy says so. Its parts: joining and
leaving the job (``_membership``), the edges of a run (``_setup``), the batch loop (``_batches``), its end
(``_ending``: close, preemption stop), and a hook in ``run.hooks`` for what watches or adjusts a run
(``_observers``, ``numeric``, ``stragglers``, ``_warm``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any

from goodput._env import FAULTS, STOP_AFTER
from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState
from goodput.errors import ConfigError, SaveFailed
from goodput.job.folder import install_error_report, is_peer_failure
from goodput.ledger.exporters import MetricsExporter
from goodput.ledger.ledger import Ledger
from goodput.run import _setup as edges
from goodput.run._batches import BatchLoop
from goodput.run._ddp_buckets import fix_layout
from goodput.run._ending import RunEnd
from goodput.run._membership import Membership
from goodput.run._observers import WatchdogHook, builtin_hooks
from goodput.run._warm import WarmHook, exit_failed
from goodput.run.hooks import RunHook, find_hook
from goodput.run.numeric import NumericConfig
from goodput.run.stragglers import StragglerConfig, StragglerHook
from goodput.run.watchdog import HANG_TIMEOUT, collective_timeout
from goodput.warm.boot import release as release_gc

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
            ``True`` (``gp.NumericConfig()``) or a ``gp.NumericConfig(...)`` turns it on. Off, a NaN/Inf loss
            given to ``step_done`` stops the run with ``NumericFault`` (exit 65) before the step is saved.
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
        hang_timeout: float | None = HANG_TIMEOUT,
        faults: str | None = None,
        crash_loop: int | None = None,
        progress: bool = True,
        exporters: Sequence[MetricsExporter] = (),
        numeric: NumericConfig | bool = False,
        stragglers: StragglerConfig | None = None,
    ) -> None:
        install_error_report(edges.rank_now(self))
        run_dir = edges.resolve_run_dir(run_dir)
        if total_steps is not None and total_steps < 1:
            raise ConfigError(f"total_steps must be >= 1, got {total_steps}")
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.step = 0
        self._job = Membership(
            run_dir, backend, step_of=lambda: self.step, collective_timeout=collective_timeout(hang_timeout)
        )
        self.info = self._job.info
        self.ledger = Ledger(run_dir, rank=self.info.rank, attempt=self._job.attempt, began=self._job.began)
        self.attempt = self.ledger.attempt
        guard = edges.checked_numeric(numeric)
        text = faults if faults is not None else FAULTS.get()
        self._plan = edges.checked_plan(text, self.info.world_size, total_steps, numeric_on=guard is not None)
        self.config = edges.checkpoint_config(checkpoint, run_dir)
        self._manager: CheckpointManager | None = None
        self.loader: Any = None  # the loader ``batches`` reads
        self.fetch_seconds = 0.0  # the last step's wait for its batch
        self._loop = BatchLoop()  # the iteration state of ``batches``
        self._end = RunEnd(self._loop, self._job)  # closed yet, the last step saved
        self.hooks = builtin_hooks(
            self,
            worker=self._job.worker,
            plan=self._plan,
            crash_loop=crash_loop,
            progress=progress,
            exporters=exporters,
            numeric=guard,
            hang_timeout=hang_timeout,
            stragglers=stragglers,
        )
        self.faults = edges.arm_faults(self, self._plan)  # under warm restarts, the generation draws them

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
            self._manager = edges.open_manager(self, state)
            stragglers = find_hook(self.hooks, StragglerHook)
            if stragglers is not None:  # its DDP comm hook goes on before any other part's
                stragglers.monitor.attach(model)
            fix_layout(model)  # every attempt sums its gradients in one layout from its first step
            edges.arm_optimizer_faults(self, optimizer)
            self.loader = loader
            step = edges.restored_step(self, state, self._manager)
        self.ledger.restore_end(step)
        edges.record_state(self.ledger, state, self.config)
        self.step = step or 0
        self._end.last_saved = step
        self._job.preempt.start(self.step)
        edges.already_complete(self)
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

        ``ahead``: receive the next batch in a background thread while the step computes. None (the default)
        turns it on for a ``ResumableLoader`` with worker processes (a batch received but not handed out is not
        consumed); any other loader only with ``ahead=True``, and not when ``restore`` checkpoints its position
        (a ConfigError says why; docs/data.md).
        """
        loader = loader if loader is not None else self.loader
        if loader is None:
            raise ConfigError("batches() needs a loader (or one given to restore())")
        yield from self._loop.batches(self, loader, steps if steps is not None else self.total_steps, ahead)

    def step_done(self, *, loss: float | None = None) -> None:
        """Mark the step finished: record it, fire due faults, and save when the policy says so.

        Raises:
            NumericFault: ``loss`` is NaN or Inf and the numeric guard is off (with it on, the guard rolls back),
                or the guard's ladder cannot fix a fault.
        """
        manager = self.manager
        self.faults.stretch()  # a persistent slow fault makes this step longer (a straggler drill)
        self.step += 1
        step = self.step
        for hook in self.hooks:
            loss = hook.adjust_loss(self, step, loss)
        self.fetch_seconds = getattr(self.loader, "last_fetch_seconds", 0.0) or 0.0
        self.ledger.step_end(step, fetch_seconds=self.fetch_seconds, loss=loss)
        checks_began = time.perf_counter()
        for hook in self.hooks:
            if hook.on_step(self, step, loss):
                self._loop.rewound = True
                return  # rolled back in place, to an earlier step: batches() goes on from there
        self._end.checks.add(self.ledger, time.perf_counter() - checks_began)
        self.faults.check(phase="step", step=self.step)
        if self._job.preempt.should_stop(self.step):
            self._end.stop_preempted(self, self._job.preempt.requested or "a signal")
        if STOP_AFTER.get() == str(self.step):  # verify-resume's reference: one part of a world-size schedule
            self.close()
            raise SystemExit(0)
        with contextlib.suppress(SaveFailed):  # logged and in the ledger: train on, save again later
            if manager.maybe_save(step, guard=lambda: self.phase("checkpoint_save")) is not None:
                self._end.last_saved = step

    def section(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Time a named part of the step for the straggler detector (a no-op when it is off)."""
        stragglers = find_hook(self.hooks, StragglerHook)
        return stragglers.monitor.section(name) if stragglers is not None else contextlib.nullcontext()

    def save(self) -> None:
        """Save the current step now (blocking only for the strategy's blocking part)."""
        manager = self.manager
        manager.state.step = self.step
        with self.phase("checkpoint_save"):
            manager.save(self.step)
        self._end.last_saved = self.step

    def close(self) -> None:
        """Save the final step if it is not saved yet, wait until it is durable, and end the attempt."""
        self._end.close(self, "ok")

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self._end.fail(self)

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
        edges.check_train_fn(train_fn)
        while True:
            try:
                return train_fn(self)
            except Exception as err:
                self._loop.stop()
                warm = find_hook(self.hooks, WarmHook)
                if warm is None:
                    raise
                if not is_peer_failure(err):
                    exit_failed(self, err)
                try:
                    warm.rejoin(self, err, self._job)  # this process and its state go on
                except Exception as lost:  # no next generation: exit now, not through a shutdown that waits
                    exit_failed(self, lost)  # on threads still bound to the dead group (an async save's)
                self._manager = None  # bound to the dead group; a save in flight there is abandoned
                self._end.closed = False
                self.faults = edges.arm_faults(self, self._plan)

    def end_attempt(self, failure: str) -> None:
        """Record ``failure`` and close this attempt's ledger (a warm restart or a rollback follows)."""
        self.ledger.failure_detected(failure)
        self.ledger.close("failed")

    def begin_attempt(self, kind: str, *, began: float, attempt: int | None = None) -> None:
        """Open a new ledger attempt in this process (``kind``: ``"warm"`` or ``"rollback"``; ``attempt``: its
        number, as the generation's ranks agreed it; None: one more than this rank's last), whose live goodput goes
        on from the last one's, and tell the hooks."""
        before = self.ledger
        self.ledger = Ledger(self.run_dir, rank=self.info.rank, began=began, attempt=attempt)
        self.ledger.carry_live(before.live_totals())
        self.attempt = self.ledger.attempt
        for hook in self.hooks:
            hook.on_attempt(self, kind)

    def abandon(self) -> None:
        """End this run now without saving (its state must not be checkpointed): let go of what it holds, as
        an exception out of ``with Run(...)`` does; a later ``close()`` does nothing."""
        self._end.fail(self)

    def rewind(self, step: int) -> None:
        """The state was restored in place to ``step`` (a rollback): go on from there, ``step`` being saved."""
        self.step = step
        self._end.last_saved = step

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A stretch the watchdog allows longer than a step (``restore``, ``checkpoint_save``)."""
        watchdog = find_hook(self.hooks, WatchdogHook)
        return watchdog.phase(name) if watchdog is not None else contextlib.nullcontext()
