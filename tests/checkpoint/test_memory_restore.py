"""The memory tier's one-pass restore: bitwise exact, a damaged part read into the live state is loaded over,
a part with nothing to fall back to is checked before it is loaded, and the memory cadence's nearest step."""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from goodput.checkpoint.policy import EveryInterval, StepSchedule
from goodput.errors import CheckpointCorrupt, NoValidCheckpoint, StateMismatch
from tests.checkpoint.test_memory_tier import _died_after, _equal, _kw, _manager, _parts, _snapshot, _train


def _flip(part: Path, where: float = 0.5) -> None:
    blob = bytearray(part.read_bytes())
    blob[int(len(blob) * where)] ^= 0x01
    part.write_bytes(bytes(blob))


def _node(shm: Path) -> Path:
    (run_folder,) = os.listdir(shm)
    return shm / run_folder / "node-0"


def _saved_steps_3_and_4(tmp_path: Path) -> tuple[Any, Any]:
    """Train steps 1-4, close keeping the memory tier; the state after steps 3 and 4."""
    parts = _parts()
    first = _manager(tmp_path / "ck", tmp_path / "shm", **_kw(parts))
    first.restore_latest()
    _train(first, parts, range(1, 4))
    at_3 = _snapshot(parts)
    _train(first, parts, range(4, 5))
    at_4 = _snapshot(parts)
    first.close(finished=False)
    return at_3, at_4


def test_a_flipped_newest_part_read_in_place_is_loaded_over_bitwise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    at_3, at_4 = _saved_steps_3_and_4(tmp_path)
    fresh = _parts(seed=1)
    probe = _manager(tmp_path / "ck", tmp_path / "shm", **_kw(fresh))
    assert probe.restore_latest() == 4  # the one-pass path (step 3 is there to fall back to) is exact
    _equal(at_4, _snapshot(fresh))
    probe.close(finished=False)
    # A flipped byte in the tensor data: step 4's bytes reach the live tensors before the hash says so, and
    # step 3 is then loaded over them, bit for bit.
    _flip(_node(tmp_path / "shm") / "step-4" / "rank-0.part", 0.9)
    fresh = _parts(seed=2)
    second = _manager(tmp_path / "ck", tmp_path / "shm", **_kw(fresh))
    with caplog.at_level(logging.WARNING):
        assert second.restore_latest() == 3
    assert any("step 4" in r.getMessage() and "checksum" in r.getMessage() for r in caplog.records)
    _equal(at_3, _snapshot(fresh))
    second.close()


def test_with_nothing_to_fall_back_to_a_part_is_checked_before_any_byte_is_loaded(tmp_path: Path) -> None:
    parts = _parts()
    _died_after(tmp_path / "ck", tmp_path / "shm", parts, 1)  # one memory step, no durable one
    _flip(_node(tmp_path / "shm") / "step-1" / "rank-0.part", 0.9)
    fresh = _parts(seed=1)
    before = _snapshot(fresh)
    refused = _manager(tmp_path / "ck", tmp_path / "shm", **_kw(fresh))
    with pytest.raises(
        NoValidCheckpoint, match="memory-tier step 1: rank 0's part: CheckpointCorrupt: checksum"
    ):
        refused.restore_latest()  # a committed memory-tier step failed: no silent fresh start
    refused.close(finished=False)
    _equal(before, _snapshot(fresh))  # checked before a byte was loaded
    second = _manager(tmp_path / "ck", tmp_path / "shm", allow_fresh_start=True, **_kw(fresh))
    assert second.restore_latest() is None
    _equal(before, _snapshot(fresh))  # the fresh start is really fresh
    second.close()


def test_a_damaged_part_read_in_place_with_no_checkpoint_left_to_load_stops_the_restore(
    tmp_path: Path,
) -> None:
    parts = _parts()
    _died_after(tmp_path / "ck", tmp_path / "shm", parts, 4, every=3)  # durable: 3; memory: 3 and 4
    for step in (3, 4):
        _flip(_node(tmp_path / "shm") / f"step-{step}" / "rank-0.part", 0.9)
    for path in (tmp_path / "ck").rglob("*"):
        if path.is_file() and path.suffix == ".distcp":
            _flip(path)
    second = _manager(
        tmp_path / "ck", tmp_path / "shm", every=3, allow_fresh_start=True, **_kw(_parts(seed=1))
    )
    with pytest.raises(CheckpointCorrupt, match="restart the job"):
        second.restore_latest()
    second.close(finished=False)
    fresh = _parts(seed=2)
    before = _snapshot(fresh)
    again = _manager(tmp_path / "ck", tmp_path / "shm", every=3, allow_fresh_start=True, **_kw(fresh))
    assert again.restore_latest() is None  # the restarted job starts from the beginning, not a crash loop
    _equal(before, _snapshot(fresh))
    again.close(finished=False)
    refused = _manager(tmp_path / "ck", tmp_path / "shm", every=3, **_kw(_parts(seed=3)))
    with pytest.raises(
        NoValidCheckpoint, match=r"the only committed checkpoint under .* could not be loaded"
    ):
        refused.restore_latest()  # without consent, the damaged durable step 3 stops the run
    refused.close(finished=False)


def test_a_part_of_another_model_is_refused_before_any_byte_is_loaded(tmp_path: Path) -> None:
    parts = _parts()
    _died_after(tmp_path / "ck", tmp_path / "shm", parts, 2)
    torch.manual_seed(1)
    wider = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
    before = {k: v.clone() for k, v in wider.state_dict().items()}
    second = _manager(tmp_path / "ck", tmp_path / "shm", model=wider)
    with pytest.raises(StateMismatch, match=r"\[5, 16\]"):
        second.restore_latest()
    assert all(torch.equal(before[k], v) for k, v in wider.state_dict().items())
    second.close(finished=False)


def _saved_steps(schedule: StepSchedule, per_step: float, steps: int) -> list[int]:
    """The manager's protocol: at a decision step rank 0 decides the next step; the answer is read there."""
    saved: list[int] = []
    answer: tuple[int, bool, int] | None = None
    for step in range(1, steps + 1):
        now = step * per_step
        due = False
        if answer is not None and answer[0] == step:
            _, due, next_decision = answer
            answer = None
            schedule.agreed(next_decision)
        if not schedule.pending(step):
            answer = (step + 1, *schedule.decide(step + 1, now))
        if due:
            schedule.policy.saved(step, now)
            saved.append(step)
    return saved


@pytest.mark.parametrize(("nearest", "gap"), [(False, 5), (True, 4)])
def test_the_memory_schedule_saves_at_the_step_nearest_the_interval(nearest: bool, gap: int) -> None:
    # 4.3 s between saves at 1 s a step: the first step after it is 5 steps on, the nearest 4.
    saved = _saved_steps(StepSchedule(EveryInterval(4.3), nearest=nearest), 1.0, 40)
    gaps = {b - a for a, b in itertools.pairwise(saved)}
    assert gaps == {gap}, saved


@pytest.mark.parametrize("damage", [b'"T":', b"[16,8]"])
def test_a_damaged_header_is_skipped_before_any_byte_is_loaded(tmp_path: Path, damage: bytes) -> None:
    at_3, _ = _saved_steps_3_and_4(tmp_path)
    part = _node(tmp_path / "shm") / "step-4" / "rank-0.part"
    blob = part.read_bytes()
    # a broken structure, or a shape that is consistent but wrong (16x8 read as 8x16: another model's shape)
    changed = blob.replace(damage, b'"X":' if damage == b'"T":' else b"[8,16]", 1)
    assert changed != blob
    part.write_bytes(changed)
    fresh = _parts(seed=1)
    second = _manager(tmp_path / "ck", tmp_path / "shm", **_kw(fresh))
    assert second.restore_latest() == 3  # skipped as damaged, not taken for a model mismatch
    _equal(at_3, _snapshot(fresh))
    second.close()
