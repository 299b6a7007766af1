"""The straggler detector's worker side: each rank's own time per step, exchanged once a window.

Per step a rank's time splits into its batch wait (the loader's ``fetch_seconds``), its own compute, and its
wait for the other ranks. For a DDP model (the one given to ``run.restore``) a communication hook wrapping DDP's
default all-reduce times each gradient bucket: the wait is from the last bucket being ready on this rank to its
all-reduce being done, which ends only when the slowest rank's bucket is ready too. Compute is the rest of the
step. Any loop can time named parts with ``with run.section("name"):``; without a DDP model the sections'
sum is the rank's compute (nothing else tells its own work from its waits).

Once every ``StragglerConfig.every`` steps the ranks exchange one small tensor of medians (one all-gather, no
blocking collective per step); :mod:`goodput.run._straggler_rules` scores them the same on every rank, so every
rank knows the verdict without another message. Rank 0 records each window in the ledger (``straggler_window``)
and feeds the scores to the run's exporters; every rank acts on an alarm (``straggler_alarm``): stop the job
(``StragglerConfig.stop``) or, under warm restarts, let the slow rank exit so a hot spare takes its place
(``StragglerConfig.replace``).
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from goodput.errors import ConfigError, GoodputError, StragglerStop
from goodput.run._straggler_rules import RankWindow, StragglerConfig, StragglerRules, WindowVerdict
from goodput.run.hooks import RunHook

__all__ = ["StragglerConfig", "StragglerMonitor", "StragglerReplaced"]

_SECTIONS = 4  # named sections exchanged per window (the first ones the loop opens)


class StragglerReplaced(GoodputError):
    """This rank stayed slow and ``StragglerConfig(replace=True)`` hands its place to a hot spare."""


class _BucketTimes:
    """When this step's gradient buckets were ready and their all-reduces done (perf_counter seconds)."""

    def __init__(self) -> None:
        self.ready = 0.0
        self.done = 0.0
        self.process_group: Any = None

    def reset(self) -> None:
        self.ready = self.done = 0.0

    def wait(self) -> float:
        return max(0.0, self.done - self.ready) if self.ready > 0.0 else 0.0


def _timed_allreduce(state: _BucketTimes, bucket: Any) -> Any:
    """DDP's default all-reduce hook, timed: this bucket ready now, its all-reduce done when the future is."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state.ready = time.perf_counter()
    future = default_hooks.allreduce_hook(state.process_group, bucket)

    def done(fut: Any) -> Any:
        state.done = time.perf_counter()
        return fut.value()

    return future.then(done)


class StragglerMonitor:
    """Times this rank's steps and exchanges them once a window (see the module docstring).

    Args:
        config: the detector's settings.
        rank, world_size: this rank and the job's size.
        record: called on rank 0 with (event name, fields) for the ledger.
        export: called on rank 0 with (step, metrics) for the run's exporters.
        act: called on every rank with a window's verdict that raises an alarm.
    """

    def __init__(
        self,
        config: StragglerConfig,
        *,
        rank: int,
        world_size: int,
        record: Callable[..., None],
        export: Callable[[int, dict[str, float]], None],
        act: Callable[[WindowVerdict], None] = lambda verdict: None,
    ) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self._record = record
        self._export = export
        self._act = act
        self._rules = StragglerRules(config, world_size)
        self._buckets: _BucketTimes | None = None
        self._sections: dict[str, float] = {}
        self._names: list[str] = []
        self._rows: list[tuple[float, ...]] = []
        self._handed = 0.0
        self._hosts: list[str] | None = None
        self.last: WindowVerdict | None = None

    def attach(self, model: Any) -> bool:
        """Time a DDP model's gradient all-reduces; False (sections only) for any other model, or one that
        has a communication hook of its own already."""
        from torch.nn.parallel import DistributedDataParallel

        self._rows.clear()
        self._buckets = None
        self._hosts = None  # a new generation may hold a spare from another host
        self._rules = StragglerRules(self.config, self.world_size)  # the same fresh state on every rank
        if not isinstance(model, DistributedDataParallel):
            return False
        import torch
        import torch.distributed as dist

        buckets = _BucketTimes()
        buckets.process_group = model.process_group
        # DDP checks the hook's annotations as objects; this module's are strings (postponed evaluation).
        _timed_allreduce.__annotations__ = {
            "state": _BucketTimes,
            "bucket": dist.GradBucket,
            "return": torch.futures.Future[torch.Tensor],
        }
        try:
            model.register_comm_hook(buckets, _timed_allreduce)
        except RuntimeError:
            return False  # the user's own hook: keep it, time sections only
        self._buckets = buckets
        return True

    def handed(self) -> None:
        """A batch was handed to the loop: the step's own work starts."""
        self._handed = time.perf_counter()
        if self._buckets is not None:
            self._buckets.reset()
        if self._sections:
            self._sections = dict.fromkeys(self._sections, 0.0)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Time a named part of the step (summed over the step when it is entered more than once)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            if name not in self._sections and len(self._names) < _SECTIONS:
                self._names.append(name)
            self._sections[name] = self._sections.get(name, 0.0) + time.perf_counter() - start

    def step_done(self, step: int, fetch: float) -> WindowVerdict | None:
        """Record the step that just ended; at a window's end, exchange and score (every rank together)."""
        if self._handed == 0.0:
            return None
        took = time.perf_counter() - self._handed
        wait = self._buckets.wait() if self._buckets is not None else 0.0
        parts = [self._sections.get(name, 0.0) for name in self._names]
        compute = took - wait if self._buckets is not None or not parts else sum(parts)
        self._rows.append((max(0.0, compute), fetch, wait, *parts))
        self._handed = 0.0
        if step % self.config.every != 0 or len(self._rows) < 1:
            return None
        return self._exchange(step)

    def _exchange(self, step: int) -> WindowVerdict:
        rows, self._rows = self._rows, []
        medians = [statistics.median(r[i] if i < len(r) else 0.0 for r in rows) for i in range(3 + _SECTIONS)]
        gathered = _all_gather([*medians, float(len(rows))], self.world_size)
        windows = [RankWindow(g[0], g[1], g[2], int(g[-1])) for g in gathered]
        verdict = self._rules.window(windows)
        self.last = verdict
        if self._hosts is None:
            self._hosts = _hosts(self.world_size)
        if self.rank == 0:
            self._report(step, gathered, verdict)
        if verdict.alarm is not None:
            self._act(verdict)
        return verdict

    def host(self, rank: int) -> str:
        """The host of ``rank`` (known after the first window)."""
        return self._hosts[rank] if self._hosts is not None else "?"

    def _report(self, step: int, gathered: Sequence[Sequence[float]], verdict: WindowVerdict) -> None:
        steps = int(gathered[0][-1])
        self._record(
            "straggler_window",
            first_step=step - steps + 1,
            last_step=step,
            compute=[round(g[0], 6) for g in gathered],
            data=[round(g[1], 6) for g in gathered],
            wait=[round(g[2], 6) for g in gathered],
            sections={n: [round(g[3 + i], 6) for g in gathered] for i, n in enumerate(self._names)},
            scores=[round(s, 4) for s in verdict.scores],
            best_scores=[round(s, 4) for s in verdict.best_scores],
            slowest=verdict.slowest,
            cost_seconds=round(verdict.cost_seconds, 6),
        )
        self._export(step, {f"straggler_score_rank{r}": s for r, s in enumerate(verdict.scores)})
        if verdict.alarm is not None:
            self._record(
                "straggler_alarm",
                step=step,
                straggler_rank=verdict.alarm,
                host=self.host(verdict.alarm),
                kind=verdict.kind,
                score=round(verdict.scores[verdict.alarm], 4),
                windows=self.config.windows,
            )


def _all_gather(values: list[float], world_size: int) -> list[list[float]]:
    """Every rank's ``values`` (same length on every rank), by rank: one all-gather of one small tensor."""
    import torch
    import torch.distributed as dist

    if world_size == 1 or not dist.is_initialized():
        return [values]
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


def _hosts(world_size: int) -> list[str]:
    """Every rank's host name, by rank (once per monitor: an object all-gather)."""
    import torch.distributed as dist

    name = socket.gethostname()
    if world_size == 1 or not dist.is_initialized():
        return [name]
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, name)
    return [str(h) for h in out]


def attach_stragglers(
    run: Any, config: StragglerConfig | None, *, exporters: Sequence[Any] = ()
) -> StragglerMonitor | None:
    """The detector for ``run`` (None when ``config`` is None), recording to its ledger and exporters.

    Raises:
        ConfigError: ``replace=True`` without warm restarts (no spare to take the slow rank's place).
    """
    if config is None:
        return None
    if config.replace and run.warm_hook is None:
        raise ConfigError(
            "StragglerConfig(replace=True) needs hot spares: launch with goodput launch --restart warm "
            "(or use stop=True to end the job on a straggler)"
        )

    def export(step: int, metrics: dict[str, float]) -> None:
        for exporter in exporters:
            exporter.log(step, metrics)

    def act(verdict: WindowVerdict) -> None:
        assert verdict.alarm is not None
        line = (
            f"straggler: rank {verdict.alarm} on host {monitor.host(verdict.alarm)} stayed slow in "
            f"{verdict.kind} (score {verdict.scores[verdict.alarm]:.2f}, under {config.threshold} for "
            f"{config.windows} windows of {config.every} steps)"
        )
        if config.stop:
            from goodput.launch.launcher import EXIT_STRAGGLER

            run.ledger.flush()
            raise StragglerStop(
                f"{line}; stopping (exit {EXIT_STRAGGLER}): reschedule the job without that host"
            )
        if config.replace and verdict.alarm == monitor.rank:
            from goodput.run._warm import exit_failed

            exit_failed(run, StragglerReplaced(f"{line}; a hot spare takes its place"))

    monitor = StragglerMonitor(
        config,
        rank=run.info.rank,
        world_size=run.info.world_size,
        record=lambda name, **fields: run.ledger.event(name, **fields),
        export=export,
        act=act,
    )
    return monitor


class StragglerHook(RunHook):
    """The detector as one of ``Run``'s hooks: a batch handed out starts a rank's own time, a finished step
    ends it (its DDP comm hook is attached by ``Run.restore`` before the state is loaded)."""

    def __init__(self, monitor: StragglerMonitor) -> None:
        self.monitor = monitor

    def on_batch(self, run: Any, step: int) -> None:
        self.monitor.handed()

    def on_step(self, run: Any, step: int, loss: float | None) -> bool:
        self.monitor.step_done(step, run.fetch_seconds)
        return False
