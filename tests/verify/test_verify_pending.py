"""A rank killed inside a step its peers completed (a warm restart adopts the step) leaves the step's batch in its
records, marked pending: its samples are compared, its loss and random generators, which it never recorded, are
not, and the step is not "missing" from the interrupted run."""

from __future__ import annotations

import os

import numpy as np
import torch

from goodput.run.records import StepRecorder
from goodput.verify.compare import compare_records, drawn_generators, idle_generators
from goodput.verify.records import read_records

BATCH = 4


class _Loader:
    """What the recorder reads from a loader: the indices of the batch handed to the loop last."""

    def __init__(self) -> None:
        self.last_indices: np.ndarray | None = None

    def hand_over(self, step: int, rank: int, *, shift: int = 0) -> None:
        start = ((step - 1) * 2 + rank) * BATCH + shift
        self.last_indices = np.arange(start, start + BATCH)


def _train(
    recorder: StepRecorder,
    loader: _Loader,
    rank: int,
    steps: range,
    *,
    dies_in: int | None = None,
    shift: int = 0,
) -> None:
    """Record ``steps`` as ``Run`` does (the batch handed over, then the step done), drawing from torch's
    generator in each; ``dies_in``: the rank is killed in that step after the batch (its indices moved by
    ``shift``) was handed over."""
    for step in steps:
        loader.hand_over(step, rank, shift=shift if step == dies_in else 0)
        recorder.batch(step, loaders=[loader])
        if step == dies_in:
            return
        torch.rand(1)
        recorder.step(step, loaders=[loader], loss=1.0 / step + rank)
    recorder.close()


def _uninterrupted(run_dir: str) -> None:
    for rank in (0, 1):
        torch.manual_seed(rank)
        _train(StepRecorder(run_dir, rank=rank, attempt=0, world=2), _Loader(), rank, range(1, 7))


def _adopted(run_dir: str, *, shift: int = 0) -> None:
    """Rank 1 dies inside step 4 after its gradients were summed (``shift``: with other samples than the
    uninterrupted run's): rank 0 completes step 4, the job keeps it, and rank 1's replacement (a new attempt)
    trains from step 5."""
    torch.manual_seed(0)
    _train(StepRecorder(run_dir, rank=0, attempt=0, world=2), _Loader(), 0, range(1, 7))
    torch.manual_seed(1)
    _train(
        StepRecorder(run_dir, rank=1, attempt=0, world=2), _Loader(), 1, range(1, 7), dies_in=4, shift=shift
    )
    torch.manual_seed(1)
    for _ in range(4):
        torch.rand(1)  # the replacement receives the generator state of the step it resumes after
    _train(StepRecorder(run_dir, rank=1, attempt=1, world=2), _Loader(), 1, range(5, 7))


def test_a_finished_step_replaces_its_pending_line(tmp_path: str) -> None:
    run_dir = os.path.join(tmp_path, "run")
    _uninterrupted(run_dir)
    records = read_records(run_dir)
    for rank in (0, 1):
        assert sorted(records.steps[rank]) == [1, 2, 3, 4, 5, 6]
        assert not any(r.pending for r in records.steps[rank].values())
        assert all(r.loss is not None and r.rng for r in records.steps[rank].values())


def test_a_step_the_peers_completed_after_a_rank_died_in_it_is_no_difference(tmp_path: str) -> None:
    reference, adopted = os.path.join(tmp_path, "ref"), os.path.join(tmp_path, "adopted")
    _uninterrupted(reference)
    _adopted(adopted)
    ref, got = read_records(reference), read_records(adopted)
    step4 = got.steps[1][4]
    assert step4.pending and step4.loss is None and step4.ids == ref.steps[1][4].ids
    assert compare_records(ref, got) == []
    assert drawn_generators(got)[1] == {"torch"}  # the pending line is not read as a draw
    assert idle_generators(ref, got) == []


def test_a_pending_step_s_samples_are_still_compared(tmp_path: str) -> None:
    reference, adopted = os.path.join(tmp_path, "ref"), os.path.join(tmp_path, "adopted")
    _uninterrupted(reference)
    _adopted(adopted, shift=1000)
    differences = compare_records(read_records(reference), read_records(adopted))
    assert [str(d).split(" (")[0] for d in differences] == ["step 4: rank 1's sample indices differ"]


def test_a_step_no_rank_kept_is_still_missing(tmp_path: str) -> None:
    """The replacement starts after step 4 though no rank completed it: a step lost, and said so."""
    reference, lost = os.path.join(tmp_path, "ref"), os.path.join(tmp_path, "lost")
    _uninterrupted(reference)
    torch.manual_seed(0)
    _train(StepRecorder(lost, rank=0, attempt=0, world=2), _Loader(), 0, range(1, 7), dies_in=4)
    _train(StepRecorder(lost, rank=0, attempt=1, world=2), _Loader(), 0, range(5, 7))
    torch.manual_seed(1)
    _train(StepRecorder(lost, rank=1, attempt=0, world=2), _Loader(), 1, range(1, 7), dies_in=4)
    _train(StepRecorder(lost, rank=1, attempt=1, world=2), _Loader(), 1, range(5, 7))
    differences = compare_records(read_records(reference), read_records(lost))
    assert (
        differences and str(differences[0]) == "step 4: rank 0 did not train this step in the interrupted run"
    )
