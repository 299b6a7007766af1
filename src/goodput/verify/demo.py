"""The resume guarantee, checked: two runs of the same training, one interrupted, must end bit for bit equal.

Pure comparisons over what the demo's training script leaves in its run folder: ``final.json`` (hashes of the
final model and optimizer state) and ``samples/rank-<r>.jsonl`` (the sample ids of every step a rank trained,
a redone step logged again, with the step's random ``draws`` when the script logs them). The *effective* sample sequence keeps, for each step, the last time it was
trained: the one whose result survived.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "batch_epoch",
    "effective_samples",
    "first_difference",
    "global_steps",
    "read_run",
    "step_epochs",
    "trained_twice",
]


def _records(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The records of one rank's sample log, a torn line (a kill mid-write) left out."""
    for line in lines:
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def effective_samples(lines: Iterable[str]) -> dict[int, list[int]]:
    """Step -> sample ids of the last time that step was trained (a torn last line is ignored)."""
    steps: dict[int, list[int]] = {}
    for record in _records(lines):
        steps[int(record["step"])] = [int(i) for i in record["samples"]]
    return steps


def global_steps(ranks: Iterable[Iterable[str]]) -> dict[int, list[int]]:
    """Step -> the sample ids all ranks trained in it the last time it was trained, sorted: the global batch,
    whatever the world size was (a job that shrank or grew logs a step under other rank numbers).

    ``ranks`` holds each ``samples/rank-<r>.jsonl``'s lines. The last time is the highest ``attempt`` that
    logged the step (a warm generation or a cold relaunch), and within it each rank's last record (a rollback
    redoes steps in the same attempt); a torn last line is ignored.
    """
    latest: dict[int, tuple[int, dict[int, list[int]]]] = {}
    for rank, lines in enumerate(ranks):
        for record in _records(lines):
            step, attempt = int(record["step"]), int(record.get("attempt", 0))
            if step not in latest or attempt > latest[step][0]:
                latest[step] = (attempt, {})
            if attempt == latest[step][0]:
                latest[step][1][rank] = [int(i) for i in record["samples"]]
    return {
        step: sorted(i for ids in parts.values() for i in ids) for step, (_, parts) in sorted(latest.items())
    }


def trained_twice(steps: dict[int, list[int]], epochs: dict[int, int] | None = None) -> list[int]:
    """The sample ids that more than one effective step of the same epoch trained, or one step twice (none:
    exactly once). ``epochs`` maps a step to its epoch (see :func:`step_epochs`; None: every step in epoch 0),
    so a sample met again in a later epoch is not trained twice."""
    seen: set[tuple[int, int]] = set()
    twice: set[int] = set()
    for step, ids in steps.items():
        epoch = epochs.get(step, 0) if epochs is not None else 0
        for i in ids:
            if (epoch, i) in seen:
                twice.add(i)
            seen.add((epoch, i))
    return sorted(twice)


def batch_epoch(loader: Any) -> int:
    """The epoch of the batch the training loop received last from ``loader`` (a ResumableLoader): the position
    moves to the next epoch once the loader is exhausted, which a loader that loads ahead may reach before the
    loop trains the epoch's last batch."""
    return int(loader.epoch if loader.consumed else loader.epoch - 1)


def step_epochs(ranks: Iterable[Iterable[str]]) -> dict[int, int]:
    """Step -> the epoch its batch came from, as logged the last time it was trained (``epoch`` in a record of
    ``samples/rank-<r>.jsonl``; 0 where a record has none)."""
    latest: dict[int, tuple[int, int]] = {}
    for lines in ranks:
        for record in _records(lines):
            step, attempt = int(record["step"]), int(record.get("attempt", 0))
            if step not in latest or attempt >= latest[step][0]:
                latest[step] = (attempt, int(record.get("epoch", 0)))
    return {step: epoch for step, (_, epoch) in latest.items()}


def _effective_draws(lines: Iterable[str]) -> dict[int, object]:
    """Step -> the random draws logged the last time that step was trained (None when not logged)."""
    steps: dict[int, object] = {}
    for record in _records(lines):
        steps[int(record["step"])] = record.get("draws")
    return steps


def read_run(run_dir: str) -> dict[str, object]:
    """The final hashes and the per-rank effective sample sequences (and draws) of a finished run."""
    with open(os.path.join(run_dir, "final.json")) as f:
        final = json.load(f)
    folder = os.path.join(run_dir, "samples")
    ranks, draws = {}, {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            lines = f.readlines()
        ranks[name.removesuffix(".jsonl")] = effective_samples(lines)
        draws[name.removesuffix(".jsonl")] = _effective_draws(lines)
    return {"final": final, "samples": ranks, "draws": draws}


def first_difference(reference: dict[str, object], other: dict[str, object]) -> str | None:
    """A sentence naming the first way ``other`` differs from ``reference``; None when they are identical."""
    ref_final, got_final = reference["final"], other["final"]
    assert isinstance(ref_final, dict) and isinstance(got_final, dict)
    for key in ("step", "model_sha256", "optimizer_sha256"):
        if ref_final.get(key) != got_final.get(key):
            return f"final {key} differs: {ref_final.get(key)} (uninterrupted) vs {got_final.get(key)} (interrupted)"
    ref_samples, got_samples = reference["samples"], other["samples"]
    assert isinstance(ref_samples, dict) and isinstance(got_samples, dict)
    if sorted(ref_samples) != sorted(got_samples):
        return f"ranks differ: {sorted(ref_samples)} vs {sorted(got_samples)}"
    for rank in sorted(ref_samples):
        ref_steps, got_steps = ref_samples[rank], got_samples[rank]
        for step in sorted(set(ref_steps) | set(got_steps)):
            if ref_steps.get(step) != got_steps.get(step):
                return (
                    f"{rank} step {step} trained samples {got_steps.get(step)} "
                    f"where the uninterrupted run trained {ref_steps.get(step)}"
                )
    ref_draws, got_draws = reference.get("draws", {}), other.get("draws", {})
    assert isinstance(ref_draws, dict) and isinstance(got_draws, dict)
    for rank in sorted(set(ref_draws) & set(got_draws)):
        for step in sorted(ref_draws[rank]):
            if ref_draws[rank][step] != got_draws[rank].get(step):
                return (
                    f"{rank} step {step} drew {got_draws[rank].get(step)} (batch hash, loss bits) "
                    f"where the uninterrupted run drew {ref_draws[rank][step]}"
                )
    return None
