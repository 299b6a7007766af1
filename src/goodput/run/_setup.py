"""How a ``Run`` is set up: where its folder is, its options checked, its faults armed, its checkpoint manager
opened (its ``auto`` intervals fed what earlier attempts learned) and restored, a run already complete (how it
ends: ``_ending``; its batch loop: ``_batches``).

Kept apart from ``run.py`` so that the hot file only calls them.

* One run folder: ``goodput launch --run-dir`` exports ``$GOODPUT_RUN_DIR``; ``Run(run_dir)`` may repeat the
  same folder, but a different one is a ConfigError (one line; under ``goodput launch`` the job stops with
  ``EXIT_FATAL``): a drill launched into ``runs/drill`` must never resume ``runs/exp1`` behind the user's back.
* A run already complete (its restored step reaches ``total_steps``) trains nothing; rank 0 says so in one
  line, and the process goes on to ``close()`` and exits 0.
* Checkpoints go to the configured root (default ``<run_dir>/checkpoints``) unless ``$GOODPUT_CHECKPOINT_ROOT``
  names another: ``goodput drill`` moves a script's checkpoints onto the storage it injects faults into.
* A run's ``auto`` interval learns the failure rate earlier attempts of the run observed.
* A restore asks the hooks first (the warm hand-over fills the state from a survivor), else the newest valid
  checkpoint.
* A fault plan or a numeric guard that cannot apply to the run is a ConfigError when ``Run`` is made.
* ``run.warm(train)`` calls ``train(run)``: a ``train`` that cannot take the run is a ConfigError before any
  call (the TypeError of the call would fail every attempt in turn, a crash loop, instead of one line).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from goodput._env import CHECKPOINT_ROOT, NUMERIC, RUN_DIR
from goodput.checkpoint import AutoInterval, CheckpointConfig, CheckpointManager, TrainingState
from goodput.errors import ConfigError
from goodput.faults import (
    NUMERIC_ACTIONS,
    Fault,
    FaultPlan,
    check_plan,
    fault_point,
    install_faults,
    parse_faults,
)
from goodput.ledger.accounting import Accounting, account
from goodput.ledger.ledger import Ledger, read_events
from goodput.ledger.live import reserved_world
from goodput.ledger.tiers import live_recovered_share
from goodput.run._warm import WarmHook
from goodput.run.hooks import find_hook
from goodput.run.numeric import NumericConfig

if TYPE_CHECKING:
    from goodput.run.run import Run

__all__ = [
    "already_complete",
    "arm_faults",
    "arm_optimizer_faults",
    "check_train_fn",
    "checked_numeric",
    "checked_plan",
    "checkpoint_config",
    "interval_fields",
    "interval_mtbf",
    "observe_failures",
    "open_manager",
    "rank_now",
    "record_state",
    "resolve_run_dir",
    "restored_step",
]

RUN_DIR_ENV = RUN_DIR.name


def resolve_run_dir(explicit: str | None) -> str:
    """The run folder: the launcher's (``$GOODPUT_RUN_DIR``) or ``explicit``; both must name the same one."""
    launched = RUN_DIR.get() or None
    if explicit and launched and os.path.realpath(explicit) != os.path.realpath(launched):
        raise ConfigError(
            f"Run({explicit!r}) is not the run folder goodput launch --run-dir gave ({launched}): a run has "
            "one folder; pass the same one, or call Run() without a folder to use the launcher's"
        )
    run_dir = explicit or launched
    if not run_dir:
        raise ConfigError(
            f"Run needs a run folder: pass run_dir, or goodput launch --run-dir, or set {RUN_DIR_ENV}"
        )
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ConfigError(f"run folder {run_dir!r} is a file; pass a folder")
    return run_dir


def rank_now(run: Run) -> Callable[[], int]:
    """A function giving the rank ``run``'s process holds when it is called: a hot spare's is handed to it after
    it started, a shrink or grow renumbers the ranks; the launch's ``RANK`` before the run has joined its job.
    It holds ``run`` weakly (the excepthook that calls it lives as long as the process)."""
    ref = weakref.ref(run)

    def rank() -> int:
        info = getattr(ref(), "info", None)
        return int(info.rank) if info is not None else int(os.environ.get("RANK", "0"))

    return rank


def checked_numeric(numeric: object) -> NumericConfig | None:
    """The numeric guard's config from ``Run(numeric=...)`` (``True``, or False under ``GOODPUT_NUMERIC``: the
    defaults), None when it is off.

    Raises:
        ConfigError: anything but a ``NumericConfig``, True or False.
    """
    if numeric is True or (numeric is False and NUMERIC.on()):  # GOODPUT_NUMERIC: verify-rollback's
        return NumericConfig()
    if numeric is False:
        return None
    if not isinstance(numeric, NumericConfig):
        raise ConfigError(f"numeric must be a gp.NumericConfig, True or False, got {numeric!r}")
    return numeric


def checked_plan(text: str, world_size: int, total_steps: int | None, *, numeric_on: bool) -> list[Fault]:
    """The fault plan in ``text``, refused when it cannot apply to this run.

    Ranks are checked against the ranks the job reserved (``$GOODPUT_RESERVED_WORLD``), not this generation's
    world: a job that shrank in place keeps the plan it was launched with, and a fault for a rank that is gone
    fires once the job grows back.

    Raises:
        ConfigError: a fault the run cannot meet, or numeric faults without the numeric guard.
    """
    plan = parse_faults(text)
    world = max(world_size, reserved_world(world_size))
    check_plan(plan, world_size=world, total_steps=total_steps)
    if not numeric_on and any(f.action in NUMERIC_ACTIONS for f in plan):
        raise ConfigError(
            "the fault plan injects numeric faults (nan, spike, bitflip) but the numeric guard is off: "
            "pass numeric=True to drill it"
        )
    return plan


def record_state(ledger: Ledger, state: TrainingState, config: CheckpointConfig) -> None:
    """Tell the ledger which parts the checkpoints hold and how often they are saved."""
    parts = {
        "model": state.model,
        "optimizer": state.optimizer,
        "scheduler": state.scheduler,
        "scaler": state.scaler,
        "data": state.loader,
    }
    ledger.state_registered([k for k, v in parts.items() if v is not None] + ["rng", "step"])
    ledger.on_event("checkpoint_config", strategy=config.strategy, **interval_fields(config))


def already_complete(run: Run) -> bool:
    """True (and one line from rank 0) when the restored step already reaches ``total_steps``."""
    if run.total_steps is None or run.step < run.total_steps:
        return False
    if run.info.rank == 0:
        print(
            f"goodput: {run.run_dir} is already complete (step {run.step} of {run.total_steps}): nothing to "
            "train; use a new run folder to train again, or a larger total_steps to train on",
            file=sys.stderr,
            flush=True,
        )
    run.ledger.event("already_complete", step=run.step, total_steps=run.total_steps)
    return True


def open_manager(run: Run, state: TrainingState) -> CheckpointManager:
    """The run's checkpoint manager over ``state``: its events go to the ledger of the moment (a rollback or a
    warm restart opens a new attempt), and its ``auto`` interval learns the failures of earlier attempts."""
    warm = find_hook(run.hooks, WarmHook)
    manager = CheckpointManager(
        run.config,
        state,
        on_event=lambda name, **fields: run.ledger.on_event(name, **fields),
        generation_over=None if warm is None else functools.partial(warm.worker.over, warm.worker.gen),
    )
    observe_failures(manager, run.run_dir, attempt=run.attempt, rank=run.info.rank)
    return manager


def restored_step(run: Run, state: TrainingState, manager: CheckpointManager) -> int | None:
    """Fill ``state``: from the first hook that can (the warm hand-over from a survivor: the checkpoint is not
    read), else from the newest valid checkpoint. Its step, or None when the run starts from scratch."""
    for hook in run.hooks:
        step = hook.before_restore(run, state)
        if step is not None:
            return step
    return manager.restore_latest()


def observe_failures(manager: CheckpointManager, run_dir: str, *, attempt: int, rank: int) -> None:
    """Feed what earlier attempts of this run learned to the ``auto`` intervals: the failure rate they observed
    and the save costs their intervals were planned with (rank 0 decides time-based saves for every rank)."""
    record = manager.tiers[-1]  # the durable tier: its events name no tier
    tiers = [
        (tier.cadence.policy, None if tier is record else tier.name)
        for tier in manager.tiers
        if isinstance(tier.cadence.policy, AutoInterval)
    ]
    if attempt == 0 or rank != 0 or not tiers:
        return
    events = read_events(run_dir, rank=None)
    acc = account(events)
    mtbf = interval_mtbf(acc)
    for policy, tier in tiers:
        if mtbf is not None:
            policy.observe_mtbf(mtbf)
            if tier == "memory":
                # A failure recovered live from a surviving replica (warm restarts, replicated state) read no
                # checkpoint: the memory tier plans only for the others, as the run's own record counts them
                # (the share is a new manager's, planned once).
                policy.failure_share *= 1.0 - live_recovered_share(events, acc.failures)
        costs = last_planned_costs(events, tier)
        if costs is not None:
            policy.resume(*costs)


def interval_mtbf(acc: Accounting) -> float | None:
    """The mean time between the failures a checkpoint interval answers for: the job time over the failures
    that struck after their attempt had trained a step (None: none did).

    A failure that strikes an attempt still starting or restoring (a burst: the next kill lands during the
    restart the first one caused) costs that restart, but no work done since a save: the interval changes
    nothing about it. Counting it would plan for a failure rate several times the real one after every burst.
    """
    idle = sum(1 for a in acc.attempts if a.outcome == "failed" and a.steps == 0)
    lossy = acc.failures - idle
    return acc.job_seconds / lossy if lossy > 0 else None


def last_planned_costs(events: list[dict[str, Any]], tier: str | None) -> tuple[float, float] | None:
    """The (stall, persist) seconds rank 0's newest ``checkpoint_interval`` of ``tier`` (None: the durable
    tier) was planned with; None when no attempt recorded them."""
    for event in reversed(events):
        if (
            event.get("event") == "checkpoint_interval"
            and event.get("rank") == 0
            and event.get("tier") == tier
            and "stall_seconds" in event
        ):
            return float(event["stall_seconds"]), float(event["persist_seconds"])
    return None


def interval_fields(config: CheckpointConfig) -> dict[str, Any]:
    """The checkpoint interval as the ledger's ``checkpoint_config`` event names it."""
    if config.every_steps is not None:
        return {"every_steps": config.every_steps}
    if config.every_seconds is not None:
        return {"interval_seconds": config.every_seconds}
    return {}


def check_train_fn(train_fn: Callable[..., Any]) -> None:
    """Refuse a ``train`` for ``run.warm`` that cannot be called as ``train(run)``.

    Raises:
        ConfigError: naming the function and the signature it needs.
    """
    try:
        inspect.signature(train_fn).bind(None)
    except TypeError:
        name = getattr(train_fn, "__name__", repr(train_fn))
        raise ConfigError(
            f"run.warm({name}) calls {name}(run), and again after each warm restart, but {name} takes "
            f"{inspect.signature(train_fn)}: define it as def {name}(run): ..."
        ) from None
    except ValueError:  # no signature to read (a builtin): the call itself decides
        return


def arm_faults(run: Run, faults: list[Fault]) -> FaultPlan:
    """The run's fault plan (``faults``, as ``checked_plan`` parsed them) for this attempt, installed (under warm
    restarts a generation is the unit that draws random faults, the same on every rank)."""

    def fired(fault: Fault, where: str) -> None:
        run.ledger.event("fault_injected", action=fault.action, where=where, step=run.step)
        if fault.action in ("kill", "hang", "nodeloss"):
            run.ledger.flush()  # the process is about to die or stop: keep the record

    warm = find_hook(run.hooks, WarmHook)
    plan = FaultPlan(
        faults,
        rank=run.info.rank,
        world_size=run.info.world_size,
        attempt=warm.worker.gen if warm is not None else run.attempt,
        marker_dir=os.path.join(run.run_dir, "faults"),
        on_fire=fired,
    )
    install_faults(plan)
    return plan


def arm_optimizer_faults(run: Run, optimizer: Any) -> None:
    """Fire this rank's ``optimizer_step`` faults right after ``optimizer`` steps (the step in flight is
    ``run.step + 1``); no hook at all when the plan has none."""
    if optimizer is None or not any(f.phase == "optimizer_step" for f in run.faults.mine()):
        return
    optimizer.register_step_post_hook(lambda *_: fault_point("optimizer_step", run.step + 1))


def checkpoint_config(checkpoint: CheckpointConfig | None, run_dir: str) -> CheckpointConfig:
    """The run's checkpoint configuration: the script's (default, and for a config without a root:
    ``<run_dir>/checkpoints``), under the root ``$GOODPUT_CHECKPOINT_ROOT`` names when set (its store's endpoint
    and credentials from the environment)."""
    config = (checkpoint or CheckpointConfig()).rooted(run_dir)
    root = CHECKPOINT_ROOT.get()
    return dataclasses.replace(config, root=root, storage_options={}) if root else config
