"""A live progress line for training: step, loss, fetch time and live goodput (tqdm).

    progress = Progress(total=10_000, ledger=ledger)
    for step in ...:
        ...
        progress.update(step, loss=loss.item())
    progress.close()

It shows ``step 120/10000 | loss 2.314 | fetch 12ms | goodput 87.3%``; the fetch time and goodput come from
the ledger (the last step's ``fetch_seconds`` and this attempt's step compute over its time since process
start) unless given. Only rank 0 draws it by default. Any exporters given receive the same figures.
"""

from __future__ import annotations

import os
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
    ) -> None:
        if total is not None and total < 0:
            raise ConfigError(f"Progress total must be >= 0, got {total}")
        if mininterval < 0:
            raise ConfigError(f"Progress mininterval must be >= 0, got {mininterval}")
        from tqdm import tqdm

        if disable is None:
            disable = int(os.environ.get("RANK", "0")) != 0
        self._ledger = ledger
        self._exporters = list(exporters)
        self._bar: Any = tqdm(
            total=total,
            initial=initial,
            disable=disable,
            mininterval=mininterval,
            file=file,
            unit="step",
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}"
            if total
            else "{n_fmt} steps [{elapsed}, {rate_fmt}] {postfix}",
        )
        self.last_line = ""

    def update(self, step: int, *, loss: float | None = None, fetch_seconds: float | None = None) -> None:
        """Show ``step`` (the number of the step just done) with its loss, fetch time and live goodput."""
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
        metrics = {
            k: float(v)
            for k, v in (("fetch_seconds", fetch_seconds), ("goodput", goodput), ("loss", loss))
            if v is not None
        }
        for exporter in self._exporters:
            exporter.log(step, metrics)

    def close(self) -> None:
        """Draw the last state and release the line and the exporters."""
        self._bar.refresh()
        self._bar.close()
        for exporter in self._exporters:
            exporter.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
