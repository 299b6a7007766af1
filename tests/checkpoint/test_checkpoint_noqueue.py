"""A save slower than the interval (its upload held 2 s by a ``slow`` fault, as a slow store would) never queues a
second one behind it: with a duration or ``auto`` the next save waits until the first is durable while training
goes on, and ``auto`` widens its interval to at least the measured save. A step-based save due while the previous
one uploads waits for it, and the ledger charges that wait to ``checkpoint_stall``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState
from goodput.checkpoint.policy import AutoInterval
from goodput.faults import FaultPlan, install_faults, parse_faults
from goodput.job.folder import is_peer_failure
from goodput.ledger import Ledger, read_events
from goodput.ledger.accounting import account


@pytest.fixture
def slow_upload() -> Iterator[None]:
    install_faults(FaultPlan(parse_faults("slow@phase=async_upload,seconds=2")))
    try:
        yield
    finally:
        install_faults(None)


@pytest.mark.parametrize("every", ["2s", "auto"])
def test_a_save_slower_than_the_interval_never_queues_a_second_one(
    slow_upload: None, tmp_path: Path, every: str
) -> None:
    """Each step (10 ms of work) advances the manager's clock by one second; the first save's upload takes 2 s
    while the loop trains on. No second save starts while the first is in flight, the next one starts after it,
    and ``auto`` widens its interval to at least the measured save."""
    now = [0.0]
    lock = threading.Lock()

    def clock() -> float:
        with lock:
            return now[0]

    def train_one_step(step: int) -> bool:
        time.sleep(0.01)  # the step's compute
        with lock:
            now[0] += 1.0
        return manager.maybe_save(step) is not None

    model = torch.nn.Linear(64, 64)
    manager = CheckpointManager(
        CheckpointConfig(root=str(tmp_path / "ckpt"), strategy="dcp_async", every=every),
        TrainingState(model=model),
        clock=clock,
    )
    step = 1
    while not train_one_step(step):  # until the first save starts
        step += 1
    started = [step]
    step += 1
    while not manager.results:  # until the first save is durable
        if train_one_step(step):
            started.append(step)
        step += 1
    first = manager.results[0]
    # ~200 steps trained while the first save was in flight; a second save could start only as it ended (the old
    # manager started it at the next due step, 1 or 2 steps later, and blocked there until the first was durable)
    assert step > started[0] + 50
    assert all(later > started[0] + 50 for later in started[1:]), f"saves started at steps {started}"
    if every == "auto":
        policy = manager.policy
        assert isinstance(policy, AutoInterval) and policy.interval >= first.persist_seconds
    elif len(started) == 1:  # the interval passed long ago: the next step saves
        manager.wait()  # the first save's thread is done with it (it added the result just before)
        assert train_one_step(step)
    manager.close()


def test_the_wait_for_the_save_in_flight_is_charged_as_checkpoint_stall(tmp_path: Path) -> None:
    """Every upload is held 0.5 s; step 2's save, due at once, waits for step 1's: training is blocked by a save
    all that time, so the ledger's account has it as ``checkpoint_stall`` (the old manager waited before the
    stall's span began: the report charged the wait to ``other``)."""
    install_faults(FaultPlan(parse_faults("slow@phase=async_upload,seconds=0.5")))
    try:
        ledger = Ledger(str(tmp_path / "run"), rank=0, began=time.time())
        manager = CheckpointManager(
            CheckpointConfig(root=str(tmp_path / "ckpt"), strategy="dcp_async", every=1),
            TrainingState(model=torch.nn.Linear(64, 64)),
            on_event=ledger.on_event,
        )
        ledger.init_done()
        for step in (1, 2):
            ledger.step_start(step)
            ledger.step_end(step)
            manager.save(step)  # step 2's waits for step 1's upload
        manager.close()  # waits for step 2's upload, no step in between: the stall runs to durable
        ledger.close()
    finally:
        install_faults(None)
    categories = account(read_events(tmp_path / "run")).categories
    assert categories["checkpoint_stall"] >= 1.0, categories  # both uploads, each held 0.5 s
    assert categories.get("other", 0.0) < 0.25, categories


def test_auto_counts_the_background_write_s_cpu_where_training_computes_on_the_cpu(tmp_path: Path) -> None:
    """Training here computes on the CPU, so the CPU time the asynchronous save's background write spends is
    taken from it: the cost ``auto`` plans with is the blocking stall plus that time (at most the whole
    background half), not the stall alone, which would make saving as soon as the last one is durable look
    free."""
    model = torch.nn.Linear(2048, 2048)  # 16 MiB of weights: a write with measurable CPU time
    manager = CheckpointManager(
        CheckpointConfig(root=str(tmp_path / "ckpt"), strategy="dcp_async", every="auto"),
        TrainingState(model=model),
    )
    policy = manager.policy
    assert isinstance(policy, AutoInterval)
    costs: list[float] = []
    measured = policy.measured

    def record(stall: float, persist: float) -> None:
        costs.append(stall)
        measured(stall, persist)

    policy.measured = record  # type: ignore[method-assign]  # the real policy, its inputs recorded
    manager.save(1)
    manager.wait()
    (result,) = manager.results
    assert result.persist_seconds is not None
    assert (
        len(costs) == 1 and result.stall_seconds < costs[0] <= result.stall_seconds + result.persist_seconds
    )
    manager.close()


@pytest.mark.parametrize("ended", [False, True])
def test_a_save_in_flight_when_the_generation_ends_is_not_waited_for(tmp_path: Path, ended: bool) -> None:
    """Under warm restarts the manager's group can end (a peer failed, the job grows) while an asynchronous
    save's background half is inside a collective that may not return before the group's timeout: step 1's
    upload is held 2 s here, as such a collective is. Once the generation has ended, the next save's wait for
    it stops with a peer failure (the rank then leaves for the next generation, which ``Run.warm`` does on any
    ``DistError``); while the generation lives, the wait is the usual one and the save is made."""
    gone = threading.Event()
    install_faults(FaultPlan(parse_faults("slow@phase=async_upload,seconds=2")))
    try:
        manager = CheckpointManager(
            CheckpointConfig(root=str(tmp_path / "ckpt"), strategy="dcp_async", every=1),
            TrainingState(model=torch.nn.Linear(8, 8)),
            generation_over=gone.is_set,
        )
        manager.save(1)
        if ended:
            gone.set()
            with pytest.raises(torch.distributed.DistError, match="generation ended") as caught:
                manager.save(2)
            assert is_peer_failure(caught.value)
            assert manager.committed == []  # nothing settled: step 2's save never began
        else:
            manager.save(2)
            manager.wait()
            assert manager.committed == [2, 1]
        manager.close()
    finally:
        install_faults(None)
