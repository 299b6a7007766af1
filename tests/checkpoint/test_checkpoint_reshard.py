"""Restore on another world size (2 -> 1 -> 2 ranks), every strategy, real gloo ranks: the model and optimizer
come back whole (resharded), scheduler, step and data position as saved, RNG streams carried over for ranks
that exist in both runs and seeded by the documented rule for added ranks."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from goodput.checkpoint.rng import rank_seed, seed_new_rank
from goodput.testing import run_ranks
from tests.helpers import reshard_ranks as _reshard_ranks
from tests.helpers.ckpt_ranks import next_draws, same

pytestmark = pytest.mark.slow

CASES = [("torch_save", "ddp"), ("dcp", "ddp"), ("dcp_async", "ddp"), ("dcp", "fsdp")]


def _assert_same_state(saved: dict[str, Any], restored: dict[str, Any], what: str) -> None:
    diffs = same(saved["saved"]["snap"], restored["restore"]["snap"])
    assert diffs == [], f"{what}: differs after restore: {diffs}"


def _new_rank_draws(rank: int, step: int) -> tuple[float, float, list[float]]:
    state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        seed_new_rank(_reshard_ranks.SEED, rank, step)
        return next_draws()
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])


def test_two_to_one_to_two_ranks_for_every_strategy(tmp_path) -> None:
    root = str(tmp_path)
    two = run_ranks(_reshard_ranks.phase, 2, root, CASES, False)  # steps 1-2, saved at 2
    one = run_ranks(_reshard_ranks.phase, 1, root, CASES, True)  # restores 2; steps 3-4, saved at 4
    back = run_ranks(_reshard_ranks.phase, 2, root, CASES, True)  # restores 4; steps 5-6
    for strategy, wrap in CASES:
        name = f"{strategy}-{wrap}"
        saved2, got1 = two[0][name], one[0][name]
        assert got1["restore"]["restored"] == 2 and got1["restore"]["step"] == 2
        _assert_same_state(saved2, got1, f"{name} 2 -> 1")
        assert got1["restore"]["snap"]["loader"] == {"seed": 7, "consumed": 8}  # 2 steps x 2 ranks x 2
        assert got1["restore"]["draws"] == saved2["saved"]["draws"], f"{name}: rank 0's RNG not carried over"
        saved1 = one[0][name]
        for rank in (0, 1):
            got2 = back[rank][name]
            assert got2["restore"]["restored"] == 4 and got2["restore"]["step"] == 4
            _assert_same_state(saved1, got2, f"{name} 1 -> 2 rank {rank}")
            assert got2["restore"]["snap"]["loader"] == {"seed": 7, "consumed": 12}  # + 2 steps x 1 rank x 2
        assert back[0][name]["restore"]["draws"] == saved1["saved"]["draws"]
        assert back[1][name]["restore"]["draws"] == _new_rank_draws(1, 4), (
            f"{name}: rank 1 not seeded by rule"
        )
        assert back[1][name]["restore"]["draws"] != back[0][name]["restore"]["draws"]


def test_rank_seed_is_a_pure_function_that_separates_ranks_and_steps() -> None:
    assert rank_seed(0, 1, 10) == rank_seed(0, 1, 10)
    seeds = {rank_seed(s, r, t) for s in range(3) for r in range(8) for t in (0, 1, 100)}
    assert len(seeds) == 3 * 8 * 3
    assert all(0 <= x < 2**63 for x in seeds)
