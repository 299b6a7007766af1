"""The global batch under ``--shrink-after``: the rule is checked when the loader is built (before any step),
and a kept loader is re-split over a new world at the same global position."""

from __future__ import annotations

import pytest

from goodput._env import RESERVED_WORLD, WARM_MIN_WORLD
from goodput.data import ResumableLoader
from goodput.data._global_batch import regroup
from goodput.errors import ConfigError
from tests.helpers import data as _data


@pytest.fixture
def shrinkable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment goodput launch --restart warm --nproc 4 --shrink-after S --min-world 2 gives a rank."""
    monkeypatch.setenv(WARM_MIN_WORLD.name, "2")
    monkeypatch.setenv(RESERVED_WORLD.name, "4")


@pytest.mark.usefixtures("shrinkable")
def test_a_global_batch_that_some_world_size_cannot_keep_is_refused_with_the_rule() -> None:
    with pytest.raises(ConfigError, match=r"does not split over 3 ranks: .* any of 2\.\.4 ranks.*e\.g\. 12"):
        ResumableLoader(_data.Squares(96), global_batch_size=8, rank=0, world_size=4)
    with pytest.raises(ConfigError, match="give ResumableLoader global_batch_size="):
        ResumableLoader(_data.Squares(96), batch_size=2, rank=0, world_size=4)
    assert (
        ResumableLoader(_data.Squares(96), global_batch_size=12, rank=0, world_size=4).sampler.batch_size == 3
    )


def test_without_shrinking_any_world_size_that_divides_the_batch_is_fine() -> None:
    assert (
        ResumableLoader(_data.Squares(96), global_batch_size=8, rank=0, world_size=4).sampler.batch_size == 2
    )


def test_a_kept_loader_is_re_split_over_the_new_world_from_the_same_position() -> None:
    """3 ranks train 2 steps, then the survivors (old ranks 0 and 2, now 0 and 1) go on: every sample once."""
    data = _data.Squares(60)
    three = [ResumableLoader(data, global_batch_size=6, rank=r, world_size=3, shuffle=True) for r in range(3)]
    seen: list[int] = []
    iters = [iter(loader) for loader in three]
    for _ in range(2):
        for it in iters:
            seen += [int(v) for v in next(it)[:, 0].tolist()]
    position = three[0].state_dict()
    kept = [three[0], three[2]]
    for new_rank, loader in enumerate(kept):
        assert regroup(loader, new_rank, 2)
        loader.load_state_dict(position)
        assert loader.sampler.batch_size == 3
    for batches in zip(*kept, strict=True):
        for batch in batches:
            seen += [int(v) for v in batch[:, 0].tolist()]
    assert sorted(seen) == list(range(60))
    assert not regroup(kept[0], 0, 2)  # already split for this world


def test_a_kept_per_rank_loader_cannot_keep_the_global_batch() -> None:
    loader = ResumableLoader(_data.Squares(60), batch_size=2, rank=0, world_size=3)
    with pytest.raises(ConfigError, match="global_batch_size="):
        regroup(loader, 0, 2)
