"""Rebuild which samples a run's surviving history trained on, from ``samples-rank<r>.txt`` records."""

from __future__ import annotations

import os
from collections import defaultdict


def surviving_samples(run_dir: str, ranks: int, steps: int) -> dict[int, list[int]]:
    """Step -> samples of every rank, each step taken from the last attempt that trained it.

    Lines are ``attempt step sample...``; a step redone after a restart replaces the lost attempt's record.
    """
    per_step: dict[int, list[int]] = defaultdict(list)
    for rank in range(ranks):
        chosen: dict[int, tuple[int, list[int]]] = {}
        with open(os.path.join(run_dir, f"samples-rank{rank}.txt")) as f:
            for line in f:
                attempt, step, *samples = map(int, line.split())
                if step not in chosen or attempt >= chosen[step][0]:
                    chosen[step] = (attempt, samples)
        assert sorted(chosen) == list(range(1, steps + 1)), f"rank {rank} trained steps {sorted(chosen)}"
        for step, (_, samples) in chosen.items():
            per_step[step] += samples
    return per_step


def assert_exactly_once(per_step: dict[int, list[int]], dataset: int, steps_per_epoch: int) -> None:
    """Every whole epoch of the history trained on each sample exactly once."""
    for epoch in range(len(per_step) // steps_per_epoch):
        first = epoch * steps_per_epoch + 1
        seen = [s for step in range(first, first + steps_per_epoch) for s in per_step[step]]
        assert sorted(seen) == list(range(dataset)), f"epoch {epoch}: {sorted(seen)}"


def attempts_seen(run_dir: str) -> set[int]:
    with open(os.path.join(run_dir, "samples-rank0.txt")) as f:
        return {int(line.split()[0]) for line in f}
