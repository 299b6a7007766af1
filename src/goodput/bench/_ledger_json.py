"""The ledger's writer as it wrote steps before step records: a JSON line per ``step_start`` and ``step_end``
among the attempt's other events (the writer baseline of ``goodput bench ledger``, measured in the same run)."""

from __future__ import annotations

import math
import time
from typing import Any

from goodput.errors import ConfigError
from goodput.ledger import Ledger

__all__ = ["JsonStepsLedger"]


class JsonStepsLedger(Ledger):
    """``goodput.Ledger`` with its steps formatted as JSON lines, as the older format held them."""

    _indexed = False  # nor did it write the attempts' indexes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ids = f',"attempt":{self.attempt},"rank":{self.rank}'

    def step_start(self, step: int) -> None:
        mono = time.monotonic()
        line = (
            f'{{"event":"step_start","wall":{time.time()!r},"mono":{mono!r}{self._ids},"step":{int(step)}}}\n'
        )
        self._append(line, "step_start", mono, None)

    def step_end(self, step: int, *, fetch_seconds: float = 0.0, loss: float | None = None) -> None:
        fetch = float(fetch_seconds)
        if not (math.isfinite(fetch) and fetch >= 0.0):
            raise ConfigError(
                f"ledger step_end: fetch_seconds must be a finite number >= 0, got {fetch_seconds!r}"
            )
        extra = ""
        if loss is not None and math.isfinite(value := float(loss)):
            extra = f',"loss":{value!r}'
        mono = time.monotonic()
        line = (
            f'{{"event":"step_end","wall":{time.time()!r},"mono":{mono!r}{self._ids},"step":{int(step)},'
            f'"fetch_seconds":{fetch!r}{extra}}}\n'
        )
        self._append(line, "step_end", mono, fetch)
