"""The report's warm-restart line counts each warm restart once, though every rank records it."""

from __future__ import annotations

from goodput.ledger.text import _warm_lines


def test_warm_restarts_are_counted_once_per_generation() -> None:
    # two ranks recorded generation 1, one rank generation 2; one more restart was cold
    info = {
        "warm_restart": [
            {"generation": 1, "detection_seconds": 0.1},
            {"generation": 1, "detection_seconds": 0.3},
            {"generation": 2, "detection_seconds": 0.2},
        ]
    }
    (line,) = _warm_lines(info, restarts=3)
    assert "restarts: 2 warm, 1 cold" in line
    assert "detection 0.2" in line  # the mean over every rank's view
