"""Every in-place format in one job: 2 -> 1 -> 2 real gloo ranks with SIGKILLs in between, every sample of
every format trained exactly once (one multi-process run covers all formats: ``tests._formats.BUILDERS``)."""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("datasets")

from goodput.testing import free_port
from tests.helpers import formats_ranks as _formats_ranks
from tests.helpers.formats import write_all


def _run(
    workdir: Path, urls: dict[str, str], world: int, attempt: int, kill_at: int | None
) -> list[int | None]:
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(
            target=_formats_ranks.train, args=(rank, world, port, str(workdir), urls, attempt, kill_at)
        )
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    try:
        procs[-1].join(timeout=120)
    finally:
        for proc in procs:  # a survivor is stuck in (or failed) its all-reduce: end it, as torchrun would
            proc.join(timeout=0 if kill_at is not None else 120)
            if proc.is_alive():
                proc.kill()
            proc.join()
    return [proc.exitcode for proc in procs]


def _logged(workdir: Path, attempt: int) -> list[dict[str, Any]]:
    records = []
    for path in sorted(workdir.glob(f"samples-attempt{attempt}-rank*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines()]
    return records


@pytest.mark.slow
def test_every_format_trains_each_sample_once_through_kills_and_world_changes(tmp_path: Path) -> None:
    urls = write_all(str(tmp_path / "data"), _formats_ranks.N)
    assert _run(tmp_path, urls, world=2, attempt=1, kill_at=3)[-1] == -signal.SIGKILL
    assert _run(tmp_path, urls, world=1, attempt=2, kill_at=5) == [-signal.SIGKILL]
    assert _run(tmp_path, urls, world=2, attempt=3, kill_at=None) == [0, 0]

    attempts = [_logged(tmp_path, a) for a in (1, 2, 3)]
    starts = [min(r["step"] for r in records) for records in attempts]
    assert starts == [0, 3, 5]  # each attempt resumed from the last step the one before saved
    trained = [
        record
        for records, resumed in zip(attempts, [*starts[1:], None], strict=True)
        for record in records
        if resumed is None or record["step"] < resumed  # the killed attempt's unsaved steps are redone
    ]
    assert any(r["step"] == 3 for r in attempts[0]) and any(r["step"] == 5 for r in attempts[1])
    for name in urls:
        ids = [i for record in trained for i in record["ids"][name]]
        assert sorted(ids) == list(range(_formats_ranks.N)), name  # each sample exactly once
    for record in trained:  # every format read the same logical samples
        assert len({tuple(ids) for ids in record["ids"].values()}) == 1, record
