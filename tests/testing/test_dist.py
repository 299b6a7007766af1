"""run_ranks really starts a gloo group: an all-reduce sums over processes, a failing rank surfaces, and each
rank is a fresh process that sees the caller's environment."""

from __future__ import annotations

import os

import pytest

from goodput.testing import run_ranks
from goodput.testing.dist import BREAK_MESH_ENV
from tests.helpers import ranks as _ranks


def test_allreduce_over_two_processes() -> None:
    assert run_ranks(_ranks.allreduce_rank, 2) == [3.0, 3.0]


def test_failing_rank_reports_its_traceback() -> None:
    with pytest.raises(RuntimeError, match="rank one was told to fail"):
        run_ranks(_ranks.fail_on_rank_one, 2)


def test_a_failing_rank_function_is_run_once(tmp_path) -> None:
    """A rank function that ran and failed is reported, not run again (only a group that never formed is)."""
    log = tmp_path / "runs.txt"
    with pytest.raises(RuntimeError, match="rank one was told to fail"):
        run_ranks(_ranks.log_then_fail_on_rank_one, 2, str(log))
    assert sorted(log.read_text().splitlines()) == ["rank 0 ran", "rank 1 ran"]


def test_a_group_that_did_not_form_is_formed_again_from_the_start(tmp_path, monkeypatch) -> None:
    """Rank 0 fails to form the group on the first try (as gloo's mesh has, rarely): the call starts every rank
    again, and its result is the group's."""
    marker = tmp_path / "break-once"
    marker.write_text("")
    monkeypatch.setenv(BREAK_MESH_ENV, str(marker))
    assert run_ranks(_ranks.allreduce_rank, 2) == [3.0, 3.0]
    assert not marker.exists()  # the first try did fail to form the group


def test_each_rank_is_a_fresh_process_forked_from_one_that_imported_torch_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ranks of every call are new processes whose parent is one server kept for the session (it paid
    torch's imports once), and each sees the caller's environment as it is at the call, not as it was when that
    server started."""
    first = run_ranks(_ranks.process_rank, 2, "GOODPUT_TEST_RANKS_MARK")
    monkeypatch.setenv("GOODPUT_TEST_RANKS_MARK", "set after the first call")
    second = run_ranks(_ranks.process_rank, 2, "GOODPUT_TEST_RANKS_MARK")
    pids = [pid for pid, _, _ in first + second]
    assert len(set(pids)) == 4 and os.getpid() not in pids
    parents = {parent for _, parent, _ in first + second}
    assert len(parents) == 1 and os.getpid() not in parents, parents
    assert [mark for _, _, mark in first] == [None, None]
    assert [mark for _, _, mark in second] == ["set after the first call"] * 2
