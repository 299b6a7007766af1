"""A live progress line for training: step, loss, fetch time and live goodput (tqdm).

    progress = Progress(total=10_000, ledger=ledger)
    for step in ...:
        ...
        progress.update(step, loss=loss.item())
    progress.close()

It shows ``step 120/10000 | loss 2.314 | fetch 12ms | goodput 87.3%``; the fetch time and goodput come from
the ledger (the last step's ``fetch_seconds`` and this process's step compute over its time since it started,
across a warm restart's or a rollback's attempts in the same process) unless given. Only rank 0 draws it by
default. Any exporters given receive the same figures, and ``capacity_goodput`` (the live goodput weighed by
the world size in force over the reserved ranks: lower while a job trains on fewer ranks after a shrink).

When the output is not a terminal (a log file, a pipe, a batch job's stdout), a redrawn line would become one
long line of carriage returns; there it writes plain lines instead: the first step, then one every
``log_interval`` seconds, and the last at close.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

from goodput.errors import ConfigError
from goodput.ledger.exporters import MetricsExporter
from goodput.ledger.ledger import Ledger

__all__ = ["Progress"]


class Progress:
    """A tqdm progress line fed with each step's figures.

    Args:
        total: steps in the run, if known.
        ledger: the attempt's ledger, source of fetch time and live goodput.
        initial: the step the attempt starts from (the restored step).
        disable: hide the line (default: on every rank but 0).
        mininterval: least seconds between redraws.
        file: where to draw (default: stderr).
        exporters: receive ``fetch_seconds``, ``goodput`` and ``loss`` each update.
        log_interval: seconds between plain lines when ``file`` is not a terminal.
    """

    def __init__(
        self,
        total: int | None = None,
        *,
        ledger: Ledger | None = None,
        initial: int = 0,
        disable: bool | None = None,
        mininterval: float = 0.5,
        file: IO[str] | None = None,
        exporters: Sequence[MetricsExporter] = (),
        log_interval: float = 30.0,
    ) -> None:
        if total is not None and total < 0:
            raise ConfigError(f"Progress total must be >= 0, got {total}")
        if mininterval < 0:
            raise ConfigError(f"Progress mininterval must be >= 0, got {mininterval}")
        from tqdm import tqdm

        if log_interval < 0:
            raise ConfigError(f"Progress log_interval must be >= 0, got {log_interval}")
        if disable is None:
            disable = int(os.environ.get("RANK", "0")) != 0
        self._ledger = ledger
        self._exporters = list(exporters)
        stream = file if file is not None else sys.stderr
        isatty = getattr(stream, "isatty", None)
        self._plain = (
            None
            if disable or (callable(isatty) and isatty())
            else _PlainLines(stream, total, log_interval, initial)
        )
        self._bar: Any = tqdm(
            disable=disable or self._plain is not None,
            total=total,
            initial=initial,
            mininterval=mininterval,
            file=file,
            unit="step",
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}"
            if total
            else "{n_fmt} steps [{elapsed}, {rate_fmt}] {postfix}",
        )
        self.last_line = ""
        # Nothing is drawn more often than every ``mininterval``: the line is formatted only then (and at
        # close), not at every step (~25 µs a step); exporters still get every step.
        self._hidden = disable and self._plain is None and not self._exporters
        self._mininterval = mininterval
        self._next_format = 0.0
        self._held: tuple[int, float | None, float | None] | None = None

    def update(self, step: int, *, loss: float | None = None, fetch_seconds: float | None = None) -> None:
        """Show ``step`` (the number of the step just done) with its loss, fetch time and live goodput."""
        if self._hidden:
            return  # hidden, no plain lines, no exporters: nothing to do
        if not self._exporters and self._mininterval > 0:
            now = time.monotonic()
            if now < self._next_format:
                self._held = (step, loss, fetch_seconds)  # drawn at the next format, or at close
                return
            self._next_format = now + self._mininterval
        self._held = None
        if fetch_seconds is None and self._ledger is not None:
            fetch_seconds = self._ledger.last_fetch_seconds
        goodput = self._ledger.live_goodput if self._ledger is not None else None
        parts = [f"step {step}"]
        if loss is not None:
            parts.append(f"loss {loss:.4g}")
        if fetch_seconds is not None:
            parts.append(f"fetch {1000.0 * fetch_seconds:.0f}ms")
        if goodput is not None:
            parts.append(f"goodput {goodput:.1%}")
        self.last_line = " | ".join(parts)
        self._bar.set_postfix_str(self.last_line, refresh=False)
        self._bar.update(step - self._bar.n)
        if self._plain is not None:
            self._plain.update(step, parts[1:])
        capacity = self._ledger.live_capacity_goodput if self._ledger is not None else None
        metrics = {
            k: float(v)
            for k, v in (
                ("fetch_seconds", fetch_seconds),
                ("goodput", goodput),
                ("capacity_goodput", capacity),
                ("loss", loss),
            )
            if v is not None
        }
        for exporter in self._exporters:
            exporter.log(step, metrics)

    def follow(self, ledger: Ledger) -> None:
        """Read the live figures from ``ledger`` from now on (a new attempt in this process: a rollback)."""
        self._ledger = ledger

    def close(self, *, exporters: bool = True) -> None:
        """Draw the last state and release the line and, unless ``exporters`` is False (the run goes on in this
        process: a warm restart's next generation logs to them), the exporters."""
        if self._held is not None:
            step, loss, fetch = self._held
            self._next_format = 0.0
            self.update(step, loss=loss, fetch_seconds=fetch)
        if self._plain is not None:
            self._plain.close()
        self._bar.refresh()
        self._bar.close()
        for exporter in self._exporters if exporters else ():
            exporter.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class _PlainLines:
    """Periodic plain lines for an output that is not a terminal: ``step 120/10000 | loss ... | 3.2 steps/s``."""

    def __init__(self, stream: IO[str], total: int | None, interval: float, initial: int) -> None:
        self._stream, self._total, self._interval, self._initial = stream, total, interval, initial
        self._start = time.monotonic()
        self._last_write: float | None = None
        self._pending: str | None = None

    def update(self, step: int, parts: list[str]) -> None:
        now = time.monotonic()
        of = f"/{self._total}" if self._total else ""
        elapsed = now - self._start
        done = step - self._initial  # steps of this attempt (a resumed run starts at its restored step)
        rate = [f"{done / elapsed:.3g} steps/s"] if elapsed > 0 and done > 0 else []
        self._pending = " | ".join([f"step {step}{of}", *parts, *rate])
        if self._last_write is None or now - self._last_write >= self._interval:
            self._write(now)

    def _write(self, now: float) -> None:
        if self._pending is None:
            return
        self._stream.write(self._pending + "\n")
        self._stream.flush()
        self._pending, self._last_write = None, now

    def close(self) -> None:
        self._write(time.monotonic())
