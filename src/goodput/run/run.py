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
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, NoReturn

from goodput.checkpoint import AutoInterval, CheckpointConfig, CheckpointManager, TrainingState
from goodput.data.loader import ResumableLoader
from goodput.data.prefetch import DevicePrefetcher
from goodput.distributed import dist_info, init_distributed
from goodput.errors import ConfigError, DataError
from goodput.faults import (
    NUMERIC_ACTIONS,
    Fault,
    FaultPlan,
    check_plan,
    fault_point,
    install_faults,
    parse_faults,
)
from goodput.launch.folder import FATAL_ERRORS, install_error_report, register_pid, report_failure
from goodput.ledger.accounting import account
from goodput.ledger.exporters import MetricsExporter
from goodput.ledger.ledger import Ledger, read_events
from goodput.ledger.tiers import live_recovered_share
from goodput.run import _runhooks
from goodput.run._attempt import agreed_attempt
from goodput.run._cachestats import CacheStatsRecorder
from goodput.run._runhooks import already_complete, resolve_run_dir, single_process_group, stop_preempted
from goodput.run.crashloop import CrashLoopDetector
from goodput.run.numeric import NumericConfig, NumericGuard
from goodput.run.progress import Progress
from goodput.run.signals import PreemptionWatch, end_with_launcher
from goodput.run.watchdog import Watchdog
from goodput.verify.records import StepRecorder
from goodput.warm.boot import release as release_gc
from goodput.warm.worker import WarmWorker, is_peer_failure, warm_enabled

__all__ = ["Run"]

RUN_DIR_ENV = "GOODPUT_RUN_DIR"


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
            data, stop bounded; see ``goodput.run.numeric``): ``gp.NumericConfig()`` turns it on; off by
            default until its per-step agreement costs under 1% of a short step (docs/numeric-faults.md).

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
        numeric: NumericConfig | None = None,
    ) -> None:
        install_error_report(int(os.environ.get("RANK", "0")))
        run_dir = resolve_run_dir(run_dir)
        if total_steps is not None and total_steps < 1:
            raise ConfigError(f"total_steps must be >= 1, got {total_steps}")
        self.run_dir = run_dir
        self.total_steps = total_steps
        # Under `goodput launch --restart warm`: a spare waits here for its rank (imports done), then joins.
        self._warm = WarmWorker() if warm_enabled() else None
        if self._warm is not None:
            self._warm.step_of = self._completed_step
            self._warm.join(backend)
            self.info = dist_info()
            self._owns_group = self.info.world_size > 1
        else:
            self.info = init_distributed(backend)
            self._owns_group = single_process_group(backend) or self.info.world_size > 1
        self._preempt = PreemptionWatch(rank=self.info.rank, world_size=self.info.world_size)
        register_pid(self.info.rank)
        end_with_launcher()  # this process ends with its parent under goodput launch (also when not booted by it)
        # One numbering for the job: every rank of this round records the same attempt (see _attempt).
        attempt = None if self._warm is not None else agreed_attempt(run_dir)
        self.ledger = Ledger(
            run_dir, rank=self.info.rank, attempt=attempt, began=self._warm.began if self._warm else None
        )
        self.attempt = self.ledger.attempt
        self._plan_text = faults if faults is not None else os.environ.get("GOODPUT_FAULTS", "")
        check_plan(parse_faults(self._plan_text), world_size=self.info.world_size, total_steps=total_steps)
        if numeric is None and any(f.action in NUMERIC_ACTIONS for f in parse_faults(self._plan_text)):
            raise ConfigError(
                "the fault plan injects numeric faults (nan, spike, bitflip) but the numeric guard is off: "
                "pass gp.Run(numeric=gp.NumericConfig()) to drill it"
            )
        self._arm_faults()
        self._node_loss_planned = any(f.action == "nodeloss" for f in parse_faults(self._plan_text))
        limit = crash_loop if crash_loop is not None else int(os.environ.get("GOODPUT_CRASH_LOOP", "3"))
        self._crash = CrashLoopDetector(run_dir, self.attempt, limit=limit) if self.info.rank == 0 else None
        if self._crash is not None:
            self._crash.check()
        self.watchdog = Watchdog(hang_timeout, on_hang=self._hung) if hang_timeout else None
        self.config = checkpoint or CheckpointConfig(root=os.path.join(run_dir, "checkpoints"))
        self._progress_on = progress
        self._exporters = list(exporters)
        self._progress: Progress | None = None
        self._manager: CheckpointManager | None = None
        self._loader: Any = None
        self._ahead: Iterator[Any] | None = (
            None  # the iterator ``batches`` reads (a receiving thread's, maybe)
        )
        self._cache_stats: CacheStatsRecorder | None = None
        self._last_saved: int | None = None
        self._closed = False
        self.step = 0
        # What verify-resume compares (only under GOODPUT_RECORDS): see goodput.run.records.
        self._records = StepRecorder.from_env(run_dir, rank=self.info.rank, attempt=self.attempt)
        self._warm_pending: Any = None  # a survivor's state, held from its failure to the next restore
        self._warm_next: dict[str, Any] | None = None
        self._warm_first: float | None = None
        self._numeric = NumericGuard(numeric) if numeric is not None else None

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
        self._manager = CheckpointManager(  # to the ledger of the moment (a rollback opens a new attempt)
            self.config, state, on_event=lambda name, **fields: self.ledger.on_event(name, **fields)
        )
        self._observe_failures(self._manager)
        self._loader = loader
        self.ledger.restore_start()
        with self._phase("restore"):
            step = self._warm_recover(state) if self._warm is not None else None
            live = step is not None
            if step is None:
                if self._node_loss_planned:
                    self._replace_lost_node(self._manager)
                step = self._manager.restore_latest()
            if self._warm is not None and step is not None:  # a warm restart before the next step hands it on
                self._warm.position_restored(step, loader, from_checkpoint=not live)
        self.ledger.restore_end(step)
        if self._numeric is not None:
            self._numeric.attach(self, state, step)
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
        self._preempt.start(self.step)
        already_complete(self)
        self.ledger.init_done()
        release_gc()  # the collector's thresholds back, the set-up's objects frozen (goodput.warm.boot)
        if self._progress_on or self._exporters:
            self._progress = Progress(
                total=self.total_steps,
                ledger=self.ledger,
                initial=self.step,
                disable=None if self._progress_on else True,
                exporters=self._exporters,
            )
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
        loader = loader if loader is not None else self._loader
        if loader is None:
            raise ConfigError("batches() needs a loader (or one given to restore())")
        self._stop_ahead()  # a previous iteration's thread must leave the loader before it is iterated again
        self._loader = loader
        self._cache_stats = CacheStatsRecorder(self.ledger, loader)
        steps = steps if steps is not None else self.total_steps
        source = loader
        if ahead and not isinstance(loader, ResumableLoader) and self._checkpointed(loader):
            raise ConfigError(
                f"batches(ahead=True) with a {type(loader).__name__} whose position the checkpoint holds: its "
                "state_dict() would count the batch received ahead as consumed, so a resume would skip it; use "
                "goodput.ResumableLoader (ahead counts only the batches the loop got) or ahead=False"
            )
        if ahead or (ahead is None and isinstance(loader, ResumableLoader) and loader.config.num_workers > 0):
            source = DevicePrefetcher(loader, "cpu")
        iterator = self._ahead = iter(source)
        self._cache_stats.epoch = int(getattr(loader, "epoch", 0))
        if self._warm is not None:
            self._warm.apply_rng()
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
                self._cache_stats.record()
                iterator = self._ahead = iter(source)  # the next epoch
                self._cache_stats.epoch = int(getattr(loader, "epoch", 0))
                continue
            empty_epochs, pending = 0, False
            yield batch
            if self._numeric is not None and self._numeric.rewound:  # rolled back: from the restored position
                self._numeric.rewound = False
                self._stop_ahead()
                iterator = self._ahead = iter(source)
                self._cache_stats.epoch = int(getattr(loader, "epoch", 0))

    def _checkpointed(self, loader: Any) -> bool:
        """Whether ``loader`` is the one given to ``restore``, whose position every checkpoint holds."""
        return self._manager is not None and self._manager.state.loader is loader

    def _stop_ahead(self) -> None:
        """Stop the background receiver of the last ``batches()`` (it joins its thread; nothing is consumed)."""
        iterator, self._ahead = self._ahead, None
        close = getattr(iterator, "close", None)
        if callable(close):
            close()

    def step_done(self, *, loss: float | None = None) -> None:
        """Mark the step finished: record it, fire due faults, and save when the policy says so."""
        manager = self.manager
        self.step += 1
        if self._numeric is not None:
            loss = self._numeric.inject(loss)  # a drill's nan/spike/bitflip fault at this step
        fetch = getattr(self._loader, "last_fetch_seconds", 0.0) or 0.0
        self.ledger.step_end(self.step, fetch_seconds=fetch, loss=loss)
        if self._records is not None:
            self._records.step(self.step, loaders=(self._loader, manager.state.loader), loss=loss)
        if self._warm is not None:
            self._warm_step_done()
        if self.watchdog is not None:
            self.watchdog.beat()
        if self._crash is not None:
            self._crash.progress(self.step)
        if self._progress is not None:
            self._progress.update(self.step, loss=loss, fetch_seconds=fetch)
        # After the step is recorded (a peer's failure inside the guard's all-gather leaves this rank where the
        # next step's collective would), before faults, preemption and saves act on a step that may be wrong.
        if self._numeric is not None and self._numeric.step(loss):
            return  # rolled back in place, to an earlier step: batches() goes on from there
        self.faults.check(phase="step", step=self.step)
        if self._preempt.should_stop(self.step):
            stop_preempted(self, self._preempt.requested or "a signal")
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
        self._close("ok")

    def _close(self, status: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_ahead()
        try:
            if self._manager is not None:
                if self._last_saved != self.step:
                    self.save()
                with self._phase("checkpoint_save"):
                    self._manager.close()
                if self._records is not None:
                    self._records.final(self._manager.state, self.step)
            if self._crash is not None:
                self._crash.close()
            if self._cache_stats is not None:
                self._cache_stats.record()
        finally:
            self._shutdown(status)

    def _shutdown(self, status: str) -> None:
        if self._numeric is not None:
            self._numeric.close()
        if self._records is not None:
            self._records.close()
        if self._progress is not None:
            self._progress.close()
        self.ledger.close(status)
        if self.watchdog is not None:
            self.watchdog.close()
        self._preempt.close()
        install_faults(None)
        if self._warm is not None:
            self._warm.stop_watch()
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
        _runhooks.check_train_fn(train_fn)
        while True:
            try:
                return train_fn(self)
            except Exception as err:
                self._stop_ahead()
                if self._warm is None:
                    raise
                if not is_peer_failure(err):
                    self._warm_fail(err)
                self._warm_restart(err)

    def _warm_fail(self, err: BaseException) -> NoReturn:
        """This rank's own failure under warm restarts: record it and exit now, so a spare takes the rank.

        Exiting at once (not through the interpreter's shutdown, which may wait on the process group) lets the
        survivors' collectives fail promptly. The error is reported as the excepthook does (torch's error file;
        ``FATAL`` for an error a restart cannot fix, which the launcher prints in one line and stops the job on).
        """
        line = report_failure(self.info.rank, err)
        if not isinstance(err, FATAL_ERRORS):
            traceback.print_exception(err)
        self.ledger.failure_detected(f"exception on this rank: {line}"[:300])
        if self._crash is not None:
            self._crash.close()
        self.ledger.close("failed")
        sys.stderr.flush()
        os._exit(1)

    def _warm_restart(self, err: BaseException) -> None:
        """Leave the failed generation keeping this process and its state, and join the next one."""
        assert self._warm is not None
        self.ledger.failure_detected(f"peer failure: {str(err).splitlines()[0][:200] if str(err) else err!r}")
        self.ledger.close("failed")  # a warm restart opens a new attempt in this process
        state = self._manager.state if self._manager is not None else None
        self._warm_pending = self._warm.snapshot(self.step, state)
        self._manager = None  # bound to the dead group; a save in flight there is abandoned
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        self._preempt.leave_group()  # its group belongs to the dead generation; a preemption request stays
        with self._phase("restore"):
            self._warm_next = self._warm.leave()
        # Every rank of the new generation makes the watch's group at the same point as a spare does in __init__.
        self._preempt.join_group()
        self.ledger = Ledger(self.run_dir, rank=self.info.rank, began=self._warm.joined_wall)
        self.attempt = self.ledger.attempt
        if self._crash is not None:  # each generation is an attempt of the crash-loop count, as in __init__
            self._crash.close()
            self._crash = CrashLoopDetector(self.run_dir, self.attempt, limit=self._crash.limit)
            self._crash.check()
        if self._records is not None:  # verify-resume: the steps redone from here belong to the new attempt
            self._records.close()
            self._records = StepRecorder.from_env(self.run_dir, rank=self.info.rank, attempt=self.attempt)
        self._closed = False
        self._arm_faults()

    def _warm_recover(self, state: TrainingState) -> int | None:
        """In a generation formed by a warm restart: take the newest step from a surviving replica."""
        assert self._warm is not None
        if not self._warm.live_recovery:
            return None
        start = time.monotonic()
        fault_point("restore")
        step = self._warm.recover(self._warm_pending, state)
        parts = self._warm.parts(time.monotonic() - start, self._warm_next)
        self.ledger.event("warm_restart", restored_step=step, **parts)
        self._warm.recovered()
        self._warm_pending = self._warm_next = None
        self._warm_first = time.monotonic()
        return step

    def _completed_step(self) -> int:
        return self.step

    def _warm_step_done(self) -> None:
        assert self._warm is not None
        self._warm.step_committed(self.step, self._loader)
        if self._warm_first is not None:
            seconds = round(time.monotonic() - self._warm_first, 6)
            self.ledger.event("warm_first_step", step=self.step, seconds=seconds)
            self._warm_first = None

    def _arm_faults(self) -> None:
        # Under warm restarts a generation is the unit that draws random faults (the same on every rank).
        attempt = self._warm.gen if self._warm is not None else self.attempt
        self.faults = FaultPlan(
            parse_faults(self._plan_text),
            rank=self.info.rank,
            world_size=self.info.world_size,
            attempt=attempt,
            marker_dir=os.path.join(self.run_dir, "faults"),
            on_fire=self._fault_fired,
        )
        install_faults(self.faults)

    def _observe_failures(self, manager: CheckpointManager) -> None:
        """Feed the failure rate observed by earlier attempts of this run to the ``auto`` interval."""
        if not isinstance(manager.policy, AutoInterval) or self.attempt == 0 or self.info.rank != 0:
            return  # rank 0 decides time-based saves for every rank
        events = read_events(self.run_dir, rank=None)
        acc = account(events)
        if acc.mtbf_seconds is not None:
            manager.policy.observe_mtbf(acc.mtbf_seconds)
            if isinstance(manager.memory_policy, AutoInterval):
                manager.memory_policy.observe_mtbf(acc.mtbf_seconds)
                # A failure recovered live from a surviving replica (warm restarts, replicated state) read no
                # checkpoint: the memory tier plans only for the others, as the run's own record counts them.
                not_live = 1.0 - live_recovered_share(events, acc.failures)
                manager.memory_policy.failure_share *= not_live  # a new manager's: the planned share

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
