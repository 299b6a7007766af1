"""The memory tier in one process: an exact round trip, damaged parts skipped with a warning, run identity,
stale folders, and a real full tmpfs that falls back to the durable tier without stopping training."""

from __future__ import annotations

import copy
import gc
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, MemoryTier, TrainingState
from goodput.errors import ConfigError
from tests.helpers.ckpt_ranks import CountingLoader


def _parts(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, CountingLoader]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched, CountingLoader(0)


def _manager(
    root: Path,
    shm: Path,
    *,
    every: int = 100,
    events: list[Any] | None = None,
    allow_fresh_start: bool | None = None,
    **parts: Any,
) -> CheckpointManager:
    config = CheckpointConfig(
        root=str(root),
        every=every,
        memory=MemoryTier(every=1, folder=str(shm)),
        allow_fresh_start=allow_fresh_start,
    )
    state = TrainingState(**parts)
    hook = (lambda name, **f: events.append((name, f))) if events is not None else None
    return CheckpointManager(config, state, on_event=hook)


def _train(manager: CheckpointManager, parts: tuple[Any, ...], steps: range) -> None:
    model, opt, sched, counter = parts
    for step in steps:
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        counter.position += 4
        manager.maybe_save(step)
    memory = manager.tier("memory")
    assert memory is not None
    memory.wait()
    manager.wait()


def _died_after(root: Path, shm: Path, parts: tuple[Any, ...], last: int, every: int = 100) -> None:
    """A job that restored nothing, trained steps 1 to ``last`` saving as configured, then died (its memory
    folder stays)."""
    first = _manager(root, shm, every=every, **_kw(parts))
    first.restore_latest()
    _train(first, parts, range(1, last + 1))
    first.close(finished=False)


def _kw(parts: tuple[Any, ...]) -> dict[str, Any]:
    model, opt, sched, counter = parts
    return {"model": model, "optimizer": opt, "scheduler": sched, "loader": counter}


def _snapshot(
    parts: tuple[Any, ...],
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any], int, torch.Tensor]:
    model, opt, sched, counter = parts
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return state, copy.deepcopy(opt.state_dict()), sched.state_dict(), counter.position, torch.get_rng_state()


def _equal(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    assert a[0].keys() == b[0].keys() and all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    for key, value in a[1]["state"].items():
        for name, tensor in value.items():
            assert torch.equal(tensor, b[1]["state"][key][name]), (key, name)
    assert a[1]["param_groups"] == b[1]["param_groups"]
    assert a[2] == b[2] and a[3] == b[3] and torch.equal(a[4], b[4])


def test_round_trip_is_exact_and_recorded_by_tier(tmp_path: Path) -> None:
    parts = _parts()
    first = _manager(tmp_path / "ck", tmp_path / "shm", **_kw(parts))
    assert first.restore_latest() is None
    _train(first, parts, range(1, 6))
    expected = _snapshot(parts)
    first.close(finished=False)  # the job died: the memory folder stays
    (run_folder,) = os.listdir(tmp_path / "shm")
    # keep=2 steps; the part retention dropped is the spare that saves 4 and 5 overwrote in place
    assert sorted(os.listdir(tmp_path / "shm" / run_folder / "node-0")) == [
        "spare-rank-0.part",
        "step-4",
        "step-5",
    ]
    fresh = _parts(seed=1)
    events: list[Any] = []
    second = _manager(tmp_path / "ck", tmp_path / "shm", events=events, **_kw(fresh))
    assert second.restore_latest() == 5
    _equal(expected, _snapshot(fresh))
    restored = [f for name, f in events if name == "checkpoint_restored"]
    assert restored and restored[0]["tier"] == "memory" and restored[0]["seconds"] >= 0
    second.close()  # finished: the run's memory folder is removed
    assert os.listdir(tmp_path / "shm") == []


def test_a_durable_save_of_a_memory_saved_step_writes_the_memory_tier_s_copy(tmp_path: Path) -> None:
    """Both tiers save step 4: the durable (dcp_async) save writes from the memory tier's staging buffer (no
    second copy), and the memory save of step 5 waits for that write before staging over the buffer."""
    parts = _parts()
    first = _manager(tmp_path / "ck", tmp_path / "shm", every=2, **_kw(parts))
    _train(first, parts, range(1, 5))
    expected = _snapshot(parts)
    _train(first, parts, range(5, 6))  # restages the buffer while step 4's write may still run
    durable: Any = first.tier("durable")
    assert durable.strategy.stager.nbytes == 0  # dcp_async never staged a copy of its own
    first.close(finished=False)
    fresh = _parts(seed=1)
    config = CheckpointConfig(root=str(tmp_path / "ck"), every=2)  # the durable tier alone
    second = CheckpointManager(config, TrainingState(**_kw(fresh)))
    assert second.restore_latest() == 4
    _equal(expected, _snapshot(fresh))
    second.close()


def _damage(kind: str, folder: Path) -> str:
    part, marker = folder / "rank-0.part", folder / "rank-0.json"
    if kind == "truncated":
        part.write_bytes(part.read_bytes()[:-100])
        return "truncated"
    if kind == "flipped":
        blob = bytearray(part.read_bytes())
        blob[len(blob) // 2] ^= 0x01
        part.write_bytes(bytes(blob))
        return "checksum mismatch"
    if kind == "old_format":  # a part of an older goodput: its marker holds CRC-32s
        fields = json.loads(marker.read_text())
        fields["crc32"] = [0]
        del fields["xxh3_64"]
        marker.write_text(json.dumps(fields))
        return "older goodput"
    marker.unlink()
    return "never completed"


@pytest.mark.parametrize("kind", ["truncated", "flipped", "no_marker", "old_format"])
def test_a_damaged_part_is_skipped_with_a_warning(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged part is skipped with a warning; a part without its marker (a save a kill interrupted, what
    every restart after such a kill finds) is skipped with an info line, not a warning on the user's terminal."""
    parts = _parts()
    _died_after(tmp_path / "ck", tmp_path / "shm", parts, 4, every=3)  # durable: 3; memory: 3 and 4 kept
    (run_folder,) = os.listdir(tmp_path / "shm")
    reason = _damage(kind, tmp_path / "shm" / run_folder / "node-0" / "step-4")
    fresh = _parts(seed=1)
    events: list[Any] = []
    second = _manager(tmp_path / "ck", tmp_path / "shm", events=events, **_kw(fresh))
    with caplog.at_level(logging.INFO):
        assert second.restore_latest() == 3
    level = logging.INFO if kind == "no_marker" else logging.WARNING
    assert any(
        "step 4" in r.getMessage() and reason in r.getMessage() and r.levelno == level for r in caplog.records
    ), caplog.text
    assert [f["tier"] for name, f in events if name == "checkpoint_restored"] == ["memory"]
    second.close()


def test_without_memory_checkpoints_restore_falls_back_to_durable(tmp_path: Path) -> None:
    parts = _parts()
    first = _manager(tmp_path / "ck", tmp_path / "shm", every=3, **_kw(parts))
    first.restore_latest()
    _train(first, parts, range(1, 4))
    expected = _snapshot(parts)
    _train(first, parts, range(4, 6))
    first.close()  # finished: memory folder gone, the durable step 3 remains
    fresh = _parts(seed=1)
    events: list[Any] = []
    second = _manager(tmp_path / "ck", tmp_path / "shm", every=3, events=events, **_kw(fresh))
    assert second.restore_latest() == 3
    _equal(expected, _snapshot(fresh))
    restored = [f["tier"] for name, f in events if name == "checkpoint_restored"]
    assert restored == ["durable"]
    second.close()


def test_another_run_never_loads_these_memory_checkpoints(tmp_path: Path) -> None:
    parts = _parts()
    _died_after(tmp_path / "ck", tmp_path / "shm", parts, 2)
    other = _manager(tmp_path / "other-root", tmp_path / "shm", **_kw(_parts(seed=1)))
    assert other.restore_latest() is None  # same RAM folder, different run: nothing of the first run's
    other.close()
    # The same root started over (its checkpoints deleted) is a new run too.
    for name in os.listdir(tmp_path / "ck"):
        subprocess.run(["rm", "-rf", str(tmp_path / "ck" / name)], check=True)
    again = _manager(tmp_path / "ck", tmp_path / "shm", **_kw(_parts(seed=1)))
    assert again.restore_latest() is None
    again.close()


def test_stale_folders_of_dead_runs_are_removed_by_age(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    parts = _parts()
    _died_after(tmp_path / "a", shm, parts, 2)
    (dead,) = os.listdir(shm)
    foreign = shm / "not-ours"
    foreign.mkdir()
    old = time.time() - 3 * 86400
    for path in [shm / dead, *(shm / dead).iterdir(), foreign]:
        os.utime(path, (old, old))
    second = _manager(tmp_path / "b", shm, **_kw(_parts()))
    names = os.listdir(shm)
    assert dead not in names and "not-ours" in names and len(names) == 2  # ours, and the unknown folder kept
    second.close()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "shm"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        gc.collect()
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_a_full_tmpfs_warns_and_the_durable_tier_still_saves(
    small_tmpfs: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)  # with AdamW ~770 KiB a part: the second part cannot fit in 1 MiB
    opt = torch.optim.AdamW(model.parameters())
    events: list[Any] = []
    manager = CheckpointManager(
        CheckpointConfig(
            root=str(tmp_path / "ck"), every=2, memory=MemoryTier(every=1, folder=str(small_tmpfs))
        ),
        TrainingState(model=model, optimizer=opt),
        on_event=lambda name, **f: events.append((name, f)),
    )
    with caplog.at_level(logging.WARNING):
        for step in range(1, 5):
            model(torch.randn(2, 256)).sum().backward()
            opt.step()
            manager.maybe_save(step)
        memory = manager.tier("memory")
        assert memory is not None
        memory.wait()
        manager.wait()
    failed = [f for name, f in events if name == "memory_failed"]
    assert failed and "is full (No space left on device)" in failed[0]["error"]
    assert "No space left on device" in caplog.text
    assert [f["step"] for name, f in events if name == "checkpoint_durable"] == [2, 4]
    manager.close()


def test_memory_tier_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="keep must be an int >= 2"):
        MemoryTier(keep=1)
    with pytest.raises(ConfigError, match="replicas must be 0 or 1"):
        MemoryTier(replicas=3)
    with pytest.raises(ConfigError, match="every must be at least 1"):
        MemoryTier(every=0)


def test_ls_lists_the_memory_tier_of_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from goodput.cli import main

    parts = _parts()
    _died_after(tmp_path / "ck", tmp_path / "shm", parts, 3, every=2)
    assert main(["ls", str(tmp_path / "ck"), "--memory-folder", str(tmp_path / "shm"), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [c["step"] for c in listing["checkpoints"]] == [2]
    assert sorted((m["step"], m["kind"], m["ranks"]) for m in listing["memory"]) == [
        (2, "own", [0]),
        (3, "own", [0]),
    ]
    assert main(["ls", str(tmp_path / "ck"), "--memory-folder", str(tmp_path / "shm")]) == 0
    assert "memory tier on this machine" in capsys.readouterr().out


def test_restores_are_tallied_by_tier_with_the_steps_each_failure_lost() -> None:
    from goodput.ledger.tiers import restores_by_tier

    events = [
        {"event": "step_end", "attempt": 0, "step": 7},
        {"event": "checkpoint_restored", "attempt": 1, "step": 6, "tier": "memory", "seconds": 0.2},
        {"event": "step_end", "attempt": 1, "step": 12},
        {"event": "checkpoint_restored", "attempt": 2, "step": 8, "tier": "durable", "seconds": 3.0},
        {"event": "step_end", "attempt": 2, "step": 9},
        {"event": "checkpoint_restored", "attempt": 3, "step": 9, "tier": "memory", "seconds": 0.4},
    ]
    tiers = restores_by_tier(events)
    assert tiers["memory"] == {"count": 2.0, "seconds_mean": pytest.approx(0.3), "lost_steps_mean": 0.5}
    assert tiers["durable"] == {"count": 1.0, "seconds_mean": 3.0, "lost_steps_mean": 4.0}


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["flipped", "node_lost"])
def test_a_damaged_or_lost_own_copy_is_taken_from_the_peer_replica(tmp_path: Path, damage: str) -> None:
    from goodput.testing import run_ranks
    from tests.helpers import memory_ranks as _memory_ranks

    results = run_ranks(_memory_ranks.peer_fallback, 2, str(tmp_path / "ck"), str(tmp_path / "shm"), damage)
    for rank, result in enumerate(results):
        assert result["step"] == 3 and result["diffs"] == [], (rank, result)
        (restored,) = result["restored"]
        assert restored["tier"] == "peer"
        assert restored["source"] == ("peer" if rank == 1 else "memory")


def test_memory_stalls_count_as_stall_time_but_not_as_durable_saves() -> None:
    from goodput.ledger.accounting import account
    from tests.helpers.ledgers import Attempt

    a = Attempt(0, process_start=0.0, start=0.0)
    a.step(1, 1.0, 2.0).add("checkpoint_stall_start", 2.0, step=1, tier="memory")
    a.add("checkpoint_stall_end", 2.25, step=1, tier="memory").step(2, 2.25, 3.25)
    a.save(2, 3.25, 3.5, durable=4.0).step(3, 3.5, 4.5).add(
        "checkpoint_stall_start", 4.5, step=3, tier="memory"
    )
    a.add("checkpoint_stall_end", 4.75, step=3, tier="memory").step(4, 4.75, 5.75).add(
        "attempt_end", 5.75, status="ok"
    )
    acc = account(a.events)
    assert acc.categories["checkpoint_stall"] == pytest.approx(0.25 + 0.25 + 0.25)
    assert acc.ckpt_stall_seconds == pytest.approx(0.25)  # C is the durable tier's one save
    assert len(acc.saves) == 1
