"""Two real gloo ranks; one is SIGKILLed mid-epoch; the job resumes from its saved positions, exactly once."""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
from pathlib import Path
from typing import Any

import pytest

from goodput.testing import free_port
from tests.helpers import data_ranks as _data_ranks

KILL_AT = 5  # of 12 steps in the epoch (96 samples, 2 ranks x 4)


def _start(workdir: Path, attempt: int, kill_at: int | None) -> list[mp.process.BaseProcess]:
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=_data_ranks.train, args=(rank, 2, port, str(workdir), attempt, kill_at))
        for rank in range(2)
    ]
    for proc in procs:
        proc.start()
    return procs


def _logged(workdir: Path, attempt: int) -> list[dict[str, Any]]:
    records = []
    for rank in range(2):
        path = workdir / f"samples-attempt{attempt}-rank{rank}.jsonl"
        records += [json.loads(line) for line in path.read_text().splitlines()]
    return records


@pytest.mark.slow
def test_sigkilled_rank_resumes_exactly_once(tmp_path: Path) -> None:
    first = _start(tmp_path, attempt=1, kill_at=KILL_AT)
    try:
        first[1].join(timeout=120)
        assert first[1].exitcode == -signal.SIGKILL
    finally:
        for proc in first:  # the survivor is stuck in its all-reduce: end it, as torchrun would
            if proc.is_alive():
                proc.kill()
            proc.join()
    committed = min(json.loads((tmp_path / f"position-rank{r}.json").read_text())["step"] for r in range(2))
    assert committed == KILL_AT  # every rank saved the steps before the kill, none saved the killed step

    second = _start(tmp_path, attempt=2, kill_at=None)
    for proc in second:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in second] == [0, 0]

    before = _logged(tmp_path, 1)
    assert any(r["step"] == KILL_AT for r in before)  # the killed step was received, then lost with the rank
    kept = [i for r in before if r["step"] < committed for i in r["samples"]]
    resumed = _logged(tmp_path, 2)
    assert min(r["step"] for r in resumed) == committed
    samples = kept + [i for r in resumed for i in r["samples"]]
    assert sorted(samples) == list(range(_data_ranks.N))  # the union over ranks and attempts: exactly once
    assert json.loads((tmp_path / "position-rank0.json").read_text())["loader"]["epoch"] == 1
