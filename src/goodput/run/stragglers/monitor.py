"""The straggler detector's worker side: each rank's own time per step, exchanged once a window.

Per step a rank's time splits into its batch wait (the loader's ``fetch_seconds``), its own compute, and its
wait for the other ranks, timed by the hooks its model's parallelism offers (:mod:`goodput.run.stragglers.waits`:
DDP's communication hook, FSDP2's custom collectives). Compute is the rest of the step. Any loop can time named
parts with ``with run.section("name"):``; for a model neither DDP nor FSDP2 the sections' sum is the rank's
compute (nothing else tells its own work from its waits).

Once every ``StragglerConfig.every`` steps each rank starts an exchange of one small row of medians (and its
lowest compute) without waiting for it, and reads it at the end of the next step: by then the step's own
collectives (DDP's all-reduce, FSDP2's reduce-scatter), issued after it on the same group, have completed, so
reading it does not block and no collective is added to the step's critical path. :mod:`goodput.run.stragglers.rules` scores the figures the same
on every rank, so every rank knows the verdict without another message. Rank 0 records each window in the
ledger (``straggler_window``) and feeds the scores to the run's exporters; every rank acts on an alarm
(``straggler_alarm``): stop the job (``StragglerConfig.stop``) or, under warm restarts, let the slow rank exit
so a hot spare takes its place (``StragglerConfig.replace``).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from goodput.errors import ConfigError, GoodputError, StragglerStop
from goodput.run.hooks import RunHook
from goodput.run.stragglers.rules import RankWindow, StragglerConfig, StragglerRules, WindowVerdict

if TYPE_CHECKING:
    from goodput.run.stragglers.waits import WaitClock

__all__ = ["StragglerConfig", "StragglerMonitor", "StragglerReplaced"]

_SECTIONS = 4  # named sections exchanged per window (the first ones the loop opens)


class StragglerReplaced(GoodputError):
    """This rank stayed slow and ``StragglerConfig(replace=True)`` hands its place to a hot spare."""


class Exchange:
    """Every rank's figures of a window, exchanged without waiting (see the module docstring).

    One buffer of ``world_size`` rows, made once per process group: each rank writes its row, zeroes the others
    and starts a sum over the ranks, which leaves every rank's row on every rank (a value plus zeros is the
    value, bit for bit). A sum into one preallocated tensor costs less per window than an all-gather into a list
    of new tensors; on gloo the buffer is a NumPy array's memory, so writing a row makes no tensor.
    """

    def __init__(self, width: int, rank: int, world_size: int) -> None:
        import numpy as np
        import torch
        import torch.distributed as dist

        self._rank = rank
        self._rows = np.zeros((world_size, width))
        self._buffer: Any = None
        self._work: Any = None
        self._values: list[float] = []
        if world_size == 1 or not dist.is_initialized():
            return
        if dist.get_backend() == "nccl":
            self._buffer = torch.zeros(world_size, width, dtype=torch.float64, device="cuda")
        else:
            self._buffer = torch.from_numpy(self._rows)

    def start(self, values: list[float]) -> None:
        """Put this rank's values in and start the exchange."""
        import torch.distributed as dist

        self._values = values
        if self._buffer is None:
            return
        self._rows.fill(0.0)
        self._rows[self._rank] = values
        if self._buffer.is_cuda:
            self._buffer.copy_(self._buffer.new_tensor(self._rows))
        self._work = dist.all_reduce(self._buffer, async_op=True)

    def result(self) -> list[list[float]]:
        """Every rank's values, by rank (waits for the exchange if it is not done yet)."""
        if self._work is None:
            return [self._values]
        self._work.wait()
        self._work = None
        rows: list[list[float]] = self._buffer.tolist()
        return rows


class _Section:
    """``with monitor.section(name):`` (a class, not a generator: it runs every step)."""

    __slots__ = ("_monitor", "_name", "_start")

    def __init__(self, monitor: StragglerMonitor, name: str) -> None:
        self._monitor = monitor
        self._name = name
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._monitor._add(self._name, time.perf_counter() - self._start)


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
        self._clock: WaitClock | None = None
        self._exchange: Exchange | None = None  # made at the first window's end, once the group exists
        self._pending: int | None = None  # the last step of the window whose exchange is under way
        self._sections: dict[str, float] = {}
        self._names: list[str] = []
        self._rows: list[tuple[float, ...]] = []
        self._handed = 0.0
        self._hosts: list[str] | None = None
        self.last: WindowVerdict | None = None

    def attach(self, model: Any) -> bool:
        """Time the waits of a DDP or FSDP2 model; False (sections only) for any other model, or a DDP model
        with a communication hook of its own already."""
        from goodput.run.stragglers.waits import attach_clock

        self._rows.clear()
        self._pending = None  # a new generation's group: the old one's exchange is not read
        self._exchange = None
        self._hosts = None  # a new generation may hold a spare from another host
        self._rules = StragglerRules(self.config, self.world_size)  # the same fresh state on every rank
        self._clock = attach_clock(model)
        return self._clock is not None

    def handed(self) -> None:
        """A batch was handed to the loop: the step's own work starts."""
        self._handed = time.perf_counter()
        if self._clock is not None:
            self._clock.reset()
        if self._sections:
            self._sections = dict.fromkeys(self._sections, 0.0)

    def section(self, name: str) -> _Section:
        """Time a named part of the step (summed over the step when it is entered more than once)."""
        return _Section(self, name)

    def _add(self, name: str, seconds: float) -> None:
        if name not in self._sections and len(self._names) < _SECTIONS:
            self._names.append(name)
        self._sections[name] = self._sections.get(name, 0.0) + seconds

    def step_done(self, step: int, fetch: float) -> WindowVerdict | None:
        """Record the step that just ended; read the last window's exchange (every rank together) and, at a
        window's end, start the next; returns the verdict read at this step, if any."""
        if self._handed == 0.0:
            return None
        took = time.perf_counter() - self._handed
        wait = self._clock.wait() if self._clock is not None else 0.0
        parts = [self._sections.get(name, 0.0) for name in self._names]
        compute = took - wait if self._clock is not None or not parts else sum(parts)
        self._rows.append((max(0.0, compute), fetch, wait, *parts))
        self._handed = 0.0
        verdict = self.finish(step)
        if step % self.config.every == 0:
            rows, self._rows = self._rows, []
            medians = [_median([r[i] if i < len(r) else 0.0 for r in rows]) for i in range(3 + _SECTIONS)]
            floor = min(r[0] for r in rows)
            if self._exchange is None:
                self._exchange = Exchange(4 + _SECTIONS + 1, self.rank, self.world_size)
            self._exchange.start([*medians, floor, float(len(rows))])
            self._pending = step
        return verdict

    def finish(self, step: int) -> WindowVerdict | None:
        """Score the window whose exchange is under way (called by every rank at the same step: the next one,
        and the loop's end)."""
        if self._pending is None:
            return None
        last, self._pending = self._pending, None
        assert self._exchange is not None  # started with the pending window
        gathered = self._exchange.result()
        windows = [RankWindow(g[0], g[1], g[2], int(g[-1]), floor=g[-2]) for g in gathered]
        verdict = self._rules.window(windows)
        self.last = verdict
        if self._hosts is None:
            self._hosts = _hosts(self.world_size)
        if self.rank == 0:
            self._report(last, step, gathered, verdict)
        if verdict.alarm is not None:
            self._act(verdict)
        return verdict

    def host(self, rank: int) -> str:
        """The host of ``rank`` (known after the first window)."""
        return self._hosts[rank] if self._hosts is not None else "?"

    def _report(
        self, last: int, step: int, gathered: Sequence[Sequence[float]], verdict: WindowVerdict
    ) -> None:
        """Rank 0's record of the window ending at ``last``, read at ``step`` (where an alarm is raised)."""
        steps = int(gathered[0][-1])
        self._record(
            "straggler_window",
            first_step=last - steps + 1,
            last_step=last,
            compute=[round(g[0], 6) for g in gathered],
            data=[round(g[1], 6) for g in gathered],
            wait=[round(g[2], 6) for g in gathered],
            sections={n: [round(g[3 + i], 6) for g in gathered] for i, n in enumerate(self._names)},
            scores=[round(s, 4) for s in verdict.scores],
            best_scores=[round(s, 4) for s in verdict.best_scores],
            slowest=verdict.slowest,
            cost_seconds=round(verdict.cost_seconds, 6),
        )
        self._export(last, {f"straggler_score_rank{r}": s for r, s in enumerate(verdict.scores)})
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


def _median(values: list[float]) -> float:
    """The median of a window's values (statistics.median without its type dispatch: this runs per window)."""
    values.sort()
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


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
    run: Any, config: StragglerConfig | None, *, warm: bool, exporters: Sequence[Any] = ()
) -> StragglerMonitor | None:
    """The detector for ``run`` (None when ``config`` is None), recording to its ledger and exporters
    (``warm``: the run has hot spares, under ``--restart warm``).

    Raises:
        ConfigError: ``replace=True`` without warm restarts (no spare to take the slow rank's place).
    """
    if config is None:
        return None
    if config.replace and not warm:
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
            from goodput.job.codes import EXIT_STRAGGLER

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
    ends it, the loop's end reads the last window (its wait clock is attached by ``Run.restore`` before the
    state is loaded)."""

    def __init__(self, monitor: StragglerMonitor) -> None:
        self.monitor = monitor

    def on_batch(self, run: Any, step: int) -> None:
        self.monitor.handed()

    def on_step(self, run: Any, step: int, loss: float | None) -> bool:
        self.monitor.step_done(step, run.fetch_seconds)
        return False

    def on_loop_end(self, run: Any, closing: bool) -> bool:
        self.monitor.finish(run.step)
        return False
