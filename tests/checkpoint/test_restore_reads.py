"""What a DCP restore reads: each rank's file whole and checked by one rank, the other ranks only the bytes of
the items they need from it (DCP puts each replicated item in one rank's file), ``.metadata`` once per rank;
and no byte read without its own check reaches the live state before that file's check has passed."""

from __future__ import annotations

import re
from pathlib import Path

import fsspec
import pytest

from goodput.testing import S3Server
from goodput.testing.dist import run_ranks
from goodput.testing.faultproxy import FaultProxy
from tests.helpers import restore_ranks as _restore_ranks


def _fetched_bytes(rng: str | None, size: int) -> int:
    if rng is None:
        return size
    first, last = re.fullmatch(r"bytes=(\d+)-(\d+)", rng).groups()  # type: ignore[union-attr]
    return min(int(last), size - 1) - int(first) + 1


@pytest.mark.slow
@pytest.mark.s3
def test_s3_restore_reads_each_file_once_and_metadata_once_per_rank(s3_server: S3Server, s3_url: str) -> None:
    direct = s3_server.storage_options()
    with FaultProxy(s3_server.s3_port) as proxy:
        proxied = {**direct, "client_kwargs": {**direct["client_kwargs"], "endpoint_url": proxy.endpoint_url}}
        results = run_ranks(_restore_ranks.restore_through, 2, s3_url, direct, proxied)
        gets = [r for r in proxy.records() if r.method == "GET" and r.status in (200, 206)]
    assert [r["restored"] for r in results] == [2, 2]
    assert [r["diffs"] for r in results] == [[], []]
    fs = fsspec.filesystem("s3", **direct)
    prefix = s3_url.removeprefix("s3://")
    sizes = {path.rsplit("/", 1)[-1]: int(fs.size(path)) for path in fs.ls(f"{prefix}/step-2", detail=False)}
    fetched: dict[str, int] = {}
    for record in gets:
        name = record.path.split("?")[0].rsplit("/", 1)[-1]
        if name in sizes:
            fetched[name] = fetched.get(name, 0) + _fetched_bytes(record.range, sizes[name])
    metadata_gets = [r for r in gets if r.path.split("?")[0].endswith("/step-2/.metadata")]
    assert len(metadata_gets) == 2, f"{len(metadata_gets)} GETs of .metadata for 2 ranks"
    shards = {name: size for name, size in sizes.items() if name.endswith(".distcp")}
    assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp"]
    for name, size in shards.items():  # whole once by its rank, plus at most a small part by the other
        assert size <= fetched[name] <= 1.25 * size, (name, fetched[name], size)


@pytest.mark.slow
def test_bytes_read_in_part_wait_for_the_check_of_their_file(tmp_path: Path) -> None:
    results = run_ranks(_restore_ranks.corrupt_file_keeps_partial_reads_out, 2, str(tmp_path))
    assert [(r["healthy"], r["diffs"]) for r in results] == [(1, []), (1, [])]  # before the flipped byte
    assert [r["restored"] for r in results] == ["refused", "refused"]  # the only checkpoint, on both ranks
    for rank, result in enumerate(results):
        assert result["steps_from_corrupt_file"], result
        assert set(result["steps_from_corrupt_file"].values()) == {99.0}, (rank, result)


@pytest.mark.slow
def test_a_rank_failing_before_its_reads_does_not_leave_the_others_waiting(tmp_path: Path) -> None:
    # Each rank plans its reads alone (no DCP plan collectives); the read step's agreement is the only
    # collective, and a rank that fails before it joins it with its error.
    results = run_ranks(_restore_ranks.one_rank_fails_to_plan, 2, str(tmp_path), timeout=90.0)
    assert [(r["restored"], r["diffs"]) for r in results] == [(1, []), (1, [])]
