"""The loader's own generator and per-sample generators: randomness that resumes exactly.

The loader must never draw from torch's global generator (a resumed training loop's dropout would be one draw
ahead), its workers' seeds must be a pure function of (seed, epoch, rank), and per-sample augmentations must
not depend on workers, ranks or where the run resumed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import goodput as gp
from goodput import ConfigError, ResumableLoader
from goodput.data.randomness import loader_seed
from tests.helpers import data as _data


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterating_never_touches_the_global_generator(num_workers: int) -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    loader = ResumableLoader(_data.Squares(20), batch_size=4, seed=3, num_workers=num_workers)
    batches = [b for b in loader]
    resumed = ResumableLoader(_data.Squares(20), batch_size=4, seed=3, num_workers=num_workers)
    resumed.load_state_dict({**loader.state_dict(), "epoch": 0, "consumed": 8})
    rest = [b for b in resumed]
    assert len(batches) == 5 and len(rest) == 3
    assert torch.equal(torch.get_rng_state(), before)


def _worker_seeds(loader: ResumableLoader) -> dict[int, int]:
    return {int(i): int(s) for batch in loader for i, s in batch.tolist()}


def test_worker_seeds_are_a_pure_function_of_seed_epoch_and_rank() -> None:
    def make(rank: int = 0, seed: int = 3) -> ResumableLoader:
        return ResumableLoader(
            _data.WorkerSeed(16), batch_size=2, seed=seed, num_workers=2, rank=rank, world_size=2
        )

    torch.manual_seed(1)
    first = make()
    epoch0 = _worker_seeds(first)
    torch.manual_seed(2)  # another global state: the same worker seeds
    assert _worker_seeds(make()) == epoch0
    epoch1 = _worker_seeds(first)
    fresh = make()
    fresh.set_epoch(1)  # a resumed run's epoch 1: the same worker seeds as the continuing run's
    assert _worker_seeds(fresh) == epoch1
    rank1 = _worker_seeds(make(rank=1))
    seeds = [set(epoch0.values()), set(epoch1.values()), set(rank1.values())]
    assert all(len(s) == 2 for s in seeds)  # one seed per worker
    assert not (seeds[0] & seeds[1]) and not (seeds[0] & seeds[2])  # other epochs and ranks: other seeds
    assert len({loader_seed(3, e, r) for e in range(4) for r in range(4)}) == 16


@pytest.mark.parametrize("num_workers", [0, 2])
def test_augmentations_do_not_depend_on_workers_ranks_or_resume_point(num_workers: int) -> None:
    whole = ResumableLoader(_data.Augmented(24), batch_size=3, seed=9)
    reference = {int(row[0]): row[1:].tolist() for b in whole for row in b}
    assert len(reference) == 24
    for i, noise in reference.items():  # the dataset's generator is gp.sample_rng(index, epoch, seed)
        assert noise == torch.rand(2, generator=gp.sample_rng(i, 0, 9), dtype=torch.float64).tolist()
    for resume_at in (6, 12):
        got: dict[int, list[float]] = {}
        for rank in range(2):
            loader = ResumableLoader(
                _data.Augmented(24), batch_size=3, seed=9, num_workers=num_workers, rank=rank, world_size=2
            )
            loader.load_state_dict({**whole.state_dict(), "epoch": 0, "consumed": resume_at})
            got.update({int(row[0]): row[1:].tolist() for b in loader for row in b})
        assert got == {i: v for i, v in reference.items() if i in got} and len(got) == 24 - resume_at
    epoch1 = {int(row[0]): row[1:].tolist() for b in whole for row in b}
    assert epoch1 != reference  # a new epoch augments differently


def test_sample_rngs_are_pure_and_distinct() -> None:
    a = torch.rand(4, generator=gp.sample_rng(5, 1, 0))
    assert torch.equal(a, torch.rand(4, generator=gp.sample_rng(5, 1, 0)))
    assert not torch.equal(a, torch.rand(4, generator=gp.sample_rng(6, 1, 0)))
    assert not torch.equal(a, torch.rand(4, generator=gp.sample_rng(5, 2, 0)))
    assert not torch.equal(a, torch.rand(4, generator=gp.sample_rng(5, 1, 1)))
    n = gp.sample_np_rng(5, 1, 0).random(3)
    assert np.array_equal(n, gp.sample_np_rng(5, 1, 0).random(3))


def test_global_batch_size_is_split_over_ranks_or_refused() -> None:
    two = [ResumableLoader(_data.Squares(40), global_batch_size=8, rank=r, world_size=2) for r in range(2)]
    assert [len(next(iter(loader))) for loader in two] == [4, 4]
    with pytest.raises(ConfigError, match=r"global_batch_size 8 does not split over 3 ranks.*\(1, 2, 4, 8\)"):
        ResumableLoader(_data.Squares(40), global_batch_size=8, rank=0, world_size=3)
    with pytest.raises(ConfigError, match="exactly one of batch_size"):
        ResumableLoader(_data.Squares(40), batch_size=4, global_batch_size=8)
    with pytest.raises(ConfigError, match="exactly one of batch_size"):
        ResumableLoader(_data.Squares(40))


def test_a_changed_global_batch_is_said_not_silent(caplog: pytest.LogCaptureFixture) -> None:
    two = ResumableLoader(_data.Squares(40), batch_size=4, rank=0, world_size=2)
    next(iter(two))
    saved = two.state_dict()
    with caplog.at_level("WARNING", logger="goodput.data.loader"):
        ResumableLoader(_data.Squares(40), batch_size=4, rank=0, world_size=1).load_state_dict(saved)
    assert "saved by 2 ranks on 1: a step now takes 1 x 4 = 4 samples" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="goodput.data.loader"):
        kept = ResumableLoader(_data.Squares(40), global_batch_size=8, rank=0, world_size=1)
        kept.load_state_dict(saved)
    assert caplog.text == "" and len(next(iter(kept))) == 8


def test_retry_backoff_never_draws_from_pythons_global_generator() -> None:
    # the data cache retries from its own threads while the training loop draws from `random`
    import random

    from goodput.data._remote import RetryPolicy

    random.seed(5)
    before = random.getstate()
    delays = [RetryPolicy(attempts=4, backoff_s=0.1, max_backoff_s=1.0).delay(n) for n in (1, 2, 3)]
    assert random.getstate() == before
    assert all(0.0 <= d <= 1.0 for d in delays)
