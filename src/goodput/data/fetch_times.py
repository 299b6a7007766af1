"""``FetchTimes``: how long the training loop waited for each batch, the figure behind ``fetch_seconds``."""

from __future__ import annotations

from array import array

import numpy as np

__all__ = ["FetchTimes"]


class FetchTimes:
    """The time the training loop waited for each batch (seconds), one value per delivered batch."""

    def __init__(self) -> None:
        self._values = array("d")

    def record(self, seconds: float) -> None:
        """Add the wait for one batch."""
        self._values.append(seconds)

    @property
    def last(self) -> float:
        """The wait for the latest batch (0.0 before the first)."""
        return self._values[-1] if self._values else 0.0

    @property
    def values(self) -> list[float]:
        """Every recorded wait, in step order."""
        return self._values.tolist()

    def summary(self) -> dict[str, float]:
        """count, sum, p50, p95 and max of the recorded waits (zeros when empty)."""
        if not self._values:
            return {"count": 0, "sum": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0}
        v = np.frombuffer(self._values, dtype=np.float64)
        p50, p95 = np.percentile(v, [50, 95])
        return {
            "count": len(v),
            "sum": float(v.sum()),
            "p50": float(p50),
            "p95": float(p95),
            "max": float(v.max()),
        }

    def clear(self) -> None:
        """Forget the recorded waits (e.g. after the ledger has read them)."""
        self._values = array("d")

    def __len__(self) -> int:
        return len(self._values)
