"""The run's ledger: an append-only JSONL event log per attempt and rank, kept across restarts.

Layout: ``RUN_DIR/ledger/attempt-AAAA.rank-RRRRR.jsonl``, and beside it ``attempt-AAAA.rank-RRRRR.steps``: the
steps as fixed-size binary records (:mod:`goodput.ledger.steps`), since a long run's ledger is mostly steps
and the report reads them as arrays; and ``attempt-AAAA.index``, one per attempt, to which every rank appends
the few lines the report reads of it (:mod:`goodput.ledger.index`). Every rank writes its own files (no
gathering; the index, the one file ranks share, is appended whole lines at a time and never holds the only
copy of an event); the report reads every rank's events (from the index or its files), on the time axis of the
lowest rank present, and counts each job event once (:mod:`goodput.ledger.ranks`). An attempt is one process
lifetime of the run (under warm restarts, a surviving process opens a new attempt for each generation it
joins); its number is one more than the highest this rank has already written in the folder (torchrun's
``TORCHELASTIC_RESTART_COUNT`` is recorded beside it, but resets when a scheduler relaunches torchrun, so it
does not name the file). ``goodput.Run`` passes the number its round's ranks agreed on instead
(:mod:`goodput.run._attempt`), so that every rank of a round records the same one when the world size changes.

Writing never blocks training on I/O: an event is serialised into a memory buffer and a background thread
appends the buffer to the file every ``flush_seconds`` (0.5 s by default) with one ``write`` and, by
default, an ``fsync``. A SIGKILL loses at most the events of the last flush period; the line being written
may be torn, and :func:`read_events` ignores a torn last line with a warning. ``restore_end`` (once per
attempt) is written through at once, so the step an attempt resumed from is never among the lost.

Event schema (one JSON object per line)::

    every event      event (name), wall (time.time()), mono (time.monotonic()), attempt, rank
    attempt_start    process_start (wall time the process started), pid, host, world_size, restart_count,
                     reserved_world (the ranks the job reserved: $GOODPUT_RESERVED_WORLD, else world_size),
                     launch? (``goodput launch``'s id: attempts of one launch share it, a relaunch has another)
    init_done        -
    restore_start    -
    restore_end      step (the restored step; null when nothing was restored)
    step_start       step            (a record in the .steps file, read back as these two events)
    step_end         step, fetch_seconds (time waiting for the batch, at the start of the step), loss?
    checkpoint_stall_start   step               training is blocked by a save from here ...
    checkpoint_stall_end     step, seconds?     ... to here (also spelled checkpoint_stall, phase start/end)
                             retry?: a pause before a refused final save is tried again (stall, no save)
    checkpoint_durable       step, persist_seconds?   the save of ``step`` is committed. C (the stall) runs
                             to durable when no step ran in between (a synchronous save's commit);
                             otherwise W (persist, overlapping training) is stall end to durable
    checkpoint_failed        step, error        a save failed (tallied as a custom event); with no step
                             since its stall ended (the final save), the stall runs to here
    checkpoint_config        strategy, interval_seconds?, every_steps?
    checkpoint_interval      interval_seconds, reason, stall_seconds?, persist_seconds?, tier? ("memory")
                             the live policy changed the interval, planned with these save costs
    state_registered         keys (list: model, optimizer, scheduler, data, rng, ...)
    cache_config             folder (absolute), budget_bytes, usage_bytes (node-wide, now): the data cache
                             the run reads through, once per attempt (local rank 0 of each node; a soak
                             checks the folder against the budget)
    cache_stats              epoch, hits, misses, bytes_downloaded, wait_seconds (this epoch's),
                             budget_bytes?, dataset_bytes?
    preempted                step, signal, url     this rank saved ``step`` after a preemption signal and
                             stops (attempt_end "interrupted"; tallied as a custom event by the report)
    failure_detected         reason, silent_seconds? (time since the last progress; default: since the
                             previous event)
    attempt_end              status ("ok", "failed", "interrupted"; "exited" when the process ended without
                             closing the ledger: a failure if another attempt follows)
    warm_restart             generation, role ("survivor"/"replacement"), failed_ranks, restored_step, and the
                             parts in seconds: detection, handover, reform, restore, spare_wait, left (the
                             agent's detection to this rank's leaving its failed group) (see run/warm.py);
                             store_ops: this process's warm-store operations for the recovery (reads,
                             writes, waits; a survivor's since it left the failed group, a spare's since it
                             started)
    warm_first_step          step, seconds (restore end to the first step after a warm restart)
    shrink                   generation, step (the first step at the new size), world_before, world_after,
                             failed_ranks, seconds (failure detected to training resumed), batch_rule: the
                             group went on with fewer ranks, no process restarted (``reshape`` in the report)
    grow                     generation, step, world_before, world_after, joined, seconds (newcomer ready to
                             training resumed at the new size): the group took ranks back at a step boundary
    anything else            a custom event (eval, ...) with the caller's JSON-able fields

How a training loop feeds it (the order matters for the accounting)::

    ledger = Ledger(run_dir)               # right after imports: attempt_start, with the process start time
    ledger.restore_start(); ...; ledger.restore_end(step=restored_or_None)
    ledger.state_registered(["model", "optimizer", "data", "rng"])
    ledger.on_event("checkpoint_config", strategy="dcp_async", every_steps=500)
    ledger.init_done()
    for step in ...:
        ledger.step_start(step)            # before fetching the batch
        ...                                # fetch, forward, backward, optimizer step
        ledger.step_end(step, fetch_seconds=loader.last_fetch_seconds, loss=loss)
        manager.maybe_save(step)           # emits checkpoint_stall_start/_end, checkpoint_durable via on_event
    ledger.close()                         # attempt_end "ok"; a watchdog declaring a hang calls
                                           # failure_detected(...) then close("failed") before exiting

Step numbers: a checkpoint "at step s" holds the state after step s completes; an attempt that restores
step r redoes the steps above r. Producers call the typed methods, or :meth:`Ledger.on_event` (the
checkpoint manager's ``on_event(name, **fields)`` hook) with the names above.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import socket
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from goodput._env import LAUNCH_ID
from goodput.errors import ConfigError
from goodput.ledger.files import LEDGER_DIR, LedgerFile, ledger_files, read_events
from goodput.ledger.index import IndexWriter, index_path
from goodput.ledger.live import Live, process_start_wall, reserved_world
from goodput.ledger.steps import StepBuffer, steps_path, write_all

__all__ = ["Ledger", "LedgerConfig", "LedgerFile", "ledger_files", "read_events"]

_RESERVED = frozenset({"event", "wall", "mono", "attempt", "rank"})
_ENCODER = json.JSONEncoder(allow_nan=False)
_CACHE_COUNTERS = ("hits", "misses", "bytes_downloaded", "wait_seconds")


@dataclass(frozen=True, kw_only=True)
class LedgerConfig:
    """How the ledger writes.

    Attributes:
        flush_seconds: how often the background thread appends buffered events to the file; a SIGKILL loses
            at most this much of the log.
        fsync: fsync after each flush, so a machine crash (not only a process kill) loses at most one period.
    """

    flush_seconds: float = 0.5
    fsync: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.flush_seconds, int | float) and 0 < self.flush_seconds <= 60):
            raise ConfigError(
                f"LedgerConfig.flush_seconds must be in (0, 60] seconds, got {self.flush_seconds!r}"
            )


def _next_attempt(folder: Path, rank: int) -> int:
    mine = [f.attempt for f in ledger_files(folder.parent) if f.rank == rank]
    return max(mine) + 1 if mine else 0


class Ledger:
    """Appends one attempt's events for one rank to the run's ledger, without blocking on I/O.

    Args:
        run_dir: the run folder (local path); the ledger lives in ``run_dir/ledger``.
        rank: this process's rank (default: ``$RANK`` or 0).
        attempt: the attempt number (default: one more than this rank's highest in the folder).
        config: flush period and fsync.
        began: wall time the attempt began, when not at the process's start: a warm restart opens a new
            attempt in a surviving process, and a hot spare's attempt begins when it is handed a rank.

    Use as a context manager, or call :meth:`close`; an exception leaving the ``with`` block records
    ``attempt_end`` with status ``failed``. Methods are thread-safe.
    """

    _indexed = True  # append to the attempt's index (goodput.ledger.index)

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        rank: int | None = None,
        attempt: int | None = None,
        config: LedgerConfig | None = None,
        began: float | None = None,
    ) -> None:
        self.config = config or LedgerConfig()
        if "://" in os.fspath(run_dir):
            raise ConfigError(
                f"Ledger run_dir {os.fspath(run_dir)!r} is a URL: the ledger appends to local files; "
                "give a local run folder"
            )
        if os.path.exists(run_dir) and not os.path.isdir(run_dir):
            raise ConfigError(
                f"run folder {os.fspath(run_dir)!r} is a file: give a folder (created if missing)"
            )
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        folder = Path(run_dir) / LEDGER_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.attempt, self._fd = self._open(folder, attempt)
        self.path = folder / f"attempt-{self.attempt:04d}.rank-{self.rank:05d}.jsonl"
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending: list[bytes] = []
        self._steps = StepBuffer(steps_path(self.path))
        self._index = IndexWriter(index_path(folder, self.attempt) if self._indexed else None, self.rank)
        self._closed = False
        self._close_lock = threading.Lock()
        self._cache_seen: dict[str, float] = {}
        self._warned = False
        self._stop = threading.Event()
        now = time.time()
        process_start = began if began is not None else process_start_wall()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        reserved = reserved_world(world)
        began_at = now if process_start is None else min(process_start, now)
        self._live = Live(began_at, time.monotonic(), world=world, reserved=reserved)
        self.event(
            "attempt_start",
            process_start=self._live.process_start,
            pid=os.getpid(),
            host=socket.gethostname(),
            world_size=world,
            reserved_world=reserved,
            restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            **({"launch": LAUNCH_ID.get()} if LAUNCH_ID.get() else {}),
        )
        self._thread = threading.Thread(target=self._flush_loop, name="goodput-ledger", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _disown(me()))

    def _at_exit(self) -> None:
        # The interpreter sets sys.last_value when an uncaught exception ended the program. Otherwise the exit
        # status is unknown here (sys.exit(1) looks the same): "exited" counts as a failure when a restart
        # follows, and as a clean end when it is the run's last attempt.
        self.close("failed" if getattr(sys, "last_value", None) is not None else "exited")

    def _open(self, folder: Path, attempt: int | None) -> tuple[int, int]:
        number = _next_attempt(folder, self.rank) if attempt is None else attempt
        while True:
            path = folder / f"attempt-{number:04d}.rank-{self.rank:05d}.jsonl"
            try:
                return number, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except FileExistsError:
                if attempt is None:
                    number += 1  # another process of this rank took the number first
                    continue
            # an explicit attempt number that exists already: append, after ending any torn line
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                os.write(fd, b"\n")
            return number, fd

    # -- recording ------------------------------------------------------------------------------------

    def event(self, name: str, **fields: Any) -> None:
        """Record an event now (a built-in name from the module docstring, or a custom one).

        Raises:
            ConfigError: when a field uses a reserved key or is not JSON-serialisable.
        """
        clash = _RESERVED.intersection(fields)
        if clash:
            raise ConfigError(f"ledger event {name!r}: field names {sorted(clash)} are reserved")
        mono = time.monotonic()
        record = {
            "event": name,
            "wall": time.time(),
            "mono": mono,
            "attempt": self.attempt,
            "rank": self.rank,
        }
        record.update(fields)
        try:
            line = _ENCODER.encode(record)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"ledger event {name!r}: fields must be JSON-serialisable ({err})") from None
        self._append(line + "\n", name, mono, fields.get("fetch_seconds"))
        if name in ("shrink", "grow") and isinstance(fields.get("world_after"), int):
            with self._lock:
                self._live.resized(fields["world_after"])

    def _append(self, line: str, name: str, mono: float, fetch: Any) -> None:
        data = line.encode()  # bytes now, so the flush thread only joins and writes (little GIL time)
        with self._lock:
            if self._closed:
                return
            self._pending.append(data)
            self._index.add(name, data)
            self._live.observe(name, mono, fetch)

    def on_event(self, name: str, **fields: Any) -> None:
        """The producers' hook (``on_event(name, **fields)``), e.g. the checkpoint manager's save events."""
        self.event(name, **fields)

    def init_done(self) -> None:
        """Initialisation (imports, process group, model build) is over."""
        self.event("init_done")

    def restore_start(self) -> None:
        """Restoring from a checkpoint begins."""
        self.event("restore_start")

    def restore_end(self, step: int | None) -> None:
        """Restoring ended; ``step`` is the restored step, None when no checkpoint was found.

        Written through at once (once per attempt): a kill within the next flush period must not lose which
        step the attempt resumed from, which the report's lost-work accounting and the resume checks read.
        """
        self.event("restore_end", step=step)
        self.flush()

    def step_start(self, step: int) -> None:
        """Step ``step`` begins (before its batch is fetched)."""
        mono, wall, number = time.monotonic(), time.time(), int(step)
        with self._lock:
            if not self._closed:
                self._steps.start(number, mono, wall)
                self._live.observe("step_start", mono, None)

    def step_end(self, step: int, *, fetch_seconds: float = 0.0, loss: float | None = None) -> None:
        """Step ``step`` ended; ``fetch_seconds`` of it were spent waiting for the batch (``loss`` if finite).

        Raises:
            ConfigError: when ``fetch_seconds`` is not a finite number >= 0.
        """
        fetch = float(fetch_seconds)
        if not (math.isfinite(fetch) and fetch >= 0.0):
            raise ConfigError(
                f"ledger step_end: fetch_seconds must be a finite number >= 0, got {fetch_seconds!r}"
            )
        value = math.nan if loss is None or not math.isfinite(float(loss)) else float(loss)
        mono, wall = time.monotonic(), time.time()
        with self._lock:
            if not self._closed:
                self._steps.end(int(step), mono, fetch, value, wall)
                self._live.observe("step_end", mono, fetch)

    def failure_detected(self, reason: str, *, silent_seconds: float | None = None) -> None:
        """A failure was declared (e.g. a hang timeout) ``silent_seconds`` after the last progress."""
        self.event("failure_detected", reason=reason, silent_seconds=silent_seconds)

    def state_registered(self, keys: Sequence[str]) -> None:
        """Which parts of the training state the checkpoint holds (model, optimizer, data, rng, ...)."""
        self.event("state_registered", keys=sorted(keys))

    def cache_config(self, *, folder: str, budget_bytes: int, usage_bytes: int) -> None:
        """The data cache this node reads through: its folder, its byte budget and the bytes counted against
        the budget now, node-wide (``RemoteCache.usage_bytes()``)."""
        self.event("cache_config", folder=folder, budget_bytes=budget_bytes, usage_bytes=usage_bytes)

    def cache_stats(
        self,
        epoch: int,
        counters: Mapping[str, float],
        *,
        budget_bytes: int | None = None,
        dataset_bytes: int | None = None,
    ) -> None:
        """At the end of ``epoch``: the data cache's cumulative counters (e.g. ``RemoteCache.metrics()``).

        The event holds this epoch's share: the difference from the previous call in this attempt.
        """
        now = {k: float(counters.get(k, 0.0)) for k in _CACHE_COUNTERS}
        delta = {k: now[k] - self._cache_seen.get(k, 0.0) for k in _CACHE_COUNTERS}
        self._cache_seen = now
        self.event(
            "cache_stats", epoch=epoch, budget_bytes=budget_bytes, dataset_bytes=dataset_bytes, **delta
        )

    # -- live view ------------------------------------------------------------------------------------

    def live_totals(self) -> dict[str, float]:
        """The live totals, as another attempt of the job goes on from them (:meth:`carry_live`)."""
        with self._lock:
            return self._live.totals(time.monotonic())

    def carry_live(self, totals: Mapping[str, float]) -> None:
        """Go on from the :meth:`live_totals` of this process's previous attempt (a warm restart's survivor, a
        rollback), or of the rank whose state this hot spare took: the job's figure, not its first steps'."""
        with self._lock:
            self._live.carry(totals, time.monotonic())

    @property
    def live_goodput(self) -> float:
        """Step compute (fetch excluded) over time since the process started (or the attempt carried from)."""
        with self._lock:
            return self._live.goodput(time.monotonic())

    @property
    def live_capacity_goodput(self) -> float:
        """As :attr:`live_goodput`, each step weighed by the world size in force over the reserved ranks."""
        with self._lock:
            return self._live.capacity_goodput(time.monotonic())

    @property
    def last_fetch_seconds(self) -> float | None:
        with self._lock:
            return self._live.last_fetch

    # -- writing --------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Append everything buffered so far to the file now (the background thread does this anyway)."""
        with self._lock:
            lines, self._pending = self._pending, []
            records = self._steps.take()
            index = self._index.take()
        if not lines and not records:
            return
        with self._write_lock:
            if self._fd < 0:
                return
            try:
                self._steps.write(records, fsync=self.config.fsync)
                if lines:
                    write_all(self._fd, b"".join(lines), fsync=self.config.fsync)
                self._index.write(index, fsync=self.config.fsync)  # after the files: what it names, they hold
            except OSError as err:
                self._index.failed()
                if not self._warned:
                    self._warned = True
                    warnings.warn(f"ledger {self.path}: write failed, events dropped ({err})", stacklevel=2)

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.config.flush_seconds):
            self.flush()

    def close(self, status: str = "ok") -> None:
        """Record ``attempt_end`` with ``status``, write everything and close the file (idempotent)."""
        with self._close_lock:
            if self._closed:
                return
            self.event("attempt_end", status=status)
            with self._lock:
                self._closed = True
            self._stop.set()
            if self._thread is not threading.current_thread():
                self._thread.join()
            self.flush()
            with self._write_lock:
                os.close(self._fd)
                self._fd = -1
                self._steps.close()
                self._index.close(self._steps.last, self.attempt, fsync=self.config.fsync)
            atexit.unregister(self._at_exit)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close("ok" if exc_type is None else "failed")


def _disown(ledger: Ledger | None) -> None:
    """In a forked child (a DataLoader worker, say): the parent's ledger records nothing from here."""
    if ledger is not None:
        ledger._lock = threading.Lock()  # the parent's flush thread may have held it at the fork
        ledger._pending = []
        ledger._steps.take()
        ledger._closed = True
        atexit.unregister(ledger._at_exit)
