"""The numeric guard's all-gathers on real gloo ranks: torch's current collective, without the deprecation warning
torch 2.13 prints on every call of the old name, and the old name where torch has only that one (torch >= 2.6 is
accepted; ``all_gather_single`` came in 2.13)."""

from __future__ import annotations

import warnings
from typing import Any

from goodput.testing.dist import run_ranks


def _gathers(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from goodput.run.numeric.exchange import all_gather_flat, shared_window, start_gather
    from goodput.run.numeric.ops import gather_rows

    group = dist.group.WORLD
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        window = shared_window(
            [(step, step / 4) for step in range(rank + 2)], group
        )  # the last rank's is longest
        rows = gather_rows([rank, 10 * rank], group)
        exchanged = start_gather(7, [rank, -rank], group).rows()
    single = getattr(dist, "all_gather_single", None)
    if single is not None:  # as torch < 2.13: only the old name
        del dist.all_gather_single
    try:
        out = torch.empty(2 * world, dtype=torch.int64)
        all_gather_flat(out, torch.tensor([rank, rank + 100]), group=group)
        old_name = out.tolist()
    finally:
        if single is not None:
            dist.all_gather_single = single
    return {
        "window": window,
        "rows": rows,
        "exchanged": exchanged,
        "old_name": old_name,
        "deprecations": [str(w.message) for w in seen if issubclass(w.category, FutureWarning)],
        "has_single": single is not None,
    }


def test_the_guards_gathers_agree_on_every_rank_with_no_deprecation_and_on_the_older_name() -> None:
    results = run_ranks(_gathers, 3)
    for rank, got in enumerate(results):
        assert got["window"] == [(step, step / 4) for step in range(4)], (rank, got)
        assert got["rows"] == [[r, 10 * r] for r in range(3)], (rank, got)
        assert got["exchanged"] == [[r, -r] for r in range(3)], (rank, got)
        assert got["old_name"] == [0, 100, 1, 101, 2, 102], (rank, got)
        if got["has_single"]:
            assert got["deprecations"] == [], (rank, got["deprecations"])
