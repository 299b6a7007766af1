"""Real 2-rank gloo round trips: save, change everything, restore, and get the same run back bitwise."""

from __future__ import annotations

from typing import Any

import pytest

from goodput.testing import run_ranks
from tests.helpers import ckpt_ranks as _ckpt_ranks

pytestmark = pytest.mark.slow

CASES = [
    ("torch_save", "ddp"),
    ("dcp", "ddp"),
    ("dcp_async", "ddp"),
    ("torch_save", "fsdp"),
    ("dcp", "fsdp"),
    ("dcp_async", "fsdp"),
    ("torch_save", "fsdp+sgd"),  # torch's full-form optimizer load asserts when the optimizer keeps no tensor
]


def check_roundtrip(results: list[dict[str, Any]], step: int = 4) -> None:
    for rank, r in enumerate(results):
        assert r["restored"] == step, r
        assert r["step"] == step
        assert r["diffs"] == [], f"rank {rank} differs after restore: {r['diffs']}"
        assert r["draws_equal"], f"rank {rank}: the next random numbers differ from the uninterrupted run"
        assert r["extras"] == {"note": "x"}
    # rank 1 got rank 1's RNG and data position back, not rank 0's
    assert results[0]["draws"] != results[1]["draws"]
    assert results[0]["loader"] == {"position": 4, "rank": 0}
    assert results[1]["loader"] == {"position": 8, "rank": 1}


def test_two_rank_roundtrip_restores_everything_for_every_strategy(tmp_path) -> None:
    by_rank = run_ranks(_ckpt_ranks.roundtrip_cases, 2, str(tmp_path), CASES, {})
    for strategy, wrap in CASES:
        name = f"{strategy}-{wrap}"
        check_roundtrip([by_rank[0][name], by_rank[1][name]])
