"""run_ranks really starts a gloo group: an all-reduce sums over processes, and a failing rank surfaces."""

from __future__ import annotations

import pytest

from goodput.testing import run_ranks
from tests.helpers import ranks as _ranks


def test_allreduce_over_two_processes() -> None:
    assert run_ranks(_ranks.allreduce_rank, 2) == [3.0, 3.0]


def test_failing_rank_reports_its_traceback() -> None:
    with pytest.raises(RuntimeError, match="rank one was told to fail"):
        run_ranks(_ranks.fail_on_rank_one, 2)
