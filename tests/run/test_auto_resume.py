"""A restarted job's ``auto`` interval starts from the save costs its earlier attempts measured, and plans for
the failures that cost work since a save.

Without them a new attempt would plan from interval 0 (the costs of a save are unknown until one is measured) and
save on the steps right after every restart. One process, two attempts, real saves.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import goodput as gp
from goodput.ledger.accounting import account
from goodput.ledger.ledger import Ledger, read_events
from goodput.planning import Costs, optimal_interval
from goodput.run._setup import interval_mtbf


def _attempt(run_dir: str, until: int) -> list[int]:
    """Train a tiny model to step ``until`` (or the end, 20) and close; the steps this attempt saved."""
    config = gp.CheckpointConfig(
        root=os.path.join(run_dir, "checkpoints"), strategy="torch_save", every="auto"
    )
    run = gp.Run(run_dir, total_steps=20, checkpoint=config, hang_timeout=None, progress=False)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = gp.ResumableLoader(torch.arange(160, dtype=torch.float32).view(40, 4), batch_size=2, seed=0)
    run.restore(model=model, optimizer=opt, loader=loader)
    try:
        for batch in run.batches(loader):
            model(batch).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            run.step_done()
            if run.step == until:
                break
    finally:
        run.close()
    attempt = run.attempt
    return [
        e["step"]
        for e in read_events(run_dir, rank=0)
        if e["event"] == "checkpoint_durable" and e["attempt"] == attempt
    ]


def test_a_second_attempt_plans_with_the_first_attempts_save_costs(tmp_path: Path) -> None:
    run_dir = str(tmp_path)
    first = _attempt(run_dir, until=10)
    assert first[0] <= 3 and first[-1] == 10  # nothing measured yet: a save within the first steps
    planned = [e for e in read_events(run_dir, rank=0) if e["event"] == "checkpoint_interval"]
    stall, persist = planned[-1]["stall_seconds"], planned[-1]["persist_seconds"]
    assert stall > 0 and persist > 0

    assert _attempt(run_dir, until=20) == [20]  # only close()'s save: the interval is seconds, not 0
    # the second attempt's first interval comes from the first attempt's costs (close()'s save, measured, may
    # move it again after)
    resumed, *_ = [
        e for e in read_events(run_dir, rank=0) if e["event"] == "checkpoint_interval" and e["attempt"] == 1
    ]
    assert resumed["reason"] == "an earlier attempt's save costs"
    assert (resumed["stall_seconds"], resumed["persist_seconds"]) == (stall, persist)
    # planned as the policy plans a measured save: the prior MTBF (an hour, plus the failure-free seconds seen)
    assert resumed["interval_seconds"] >= optimal_interval(
        Costs(ckpt_stall=stall, mtbf=3600.0, persist=persist)
    )
    assert resumed["interval_seconds"] == pytest.approx(
        optimal_interval(Costs(ckpt_stall=stall, mtbf=3600.0, persist=persist)), rel=0.01
    )


def _failed_attempt(run_dir: str, steps: range) -> None:
    """One attempt in the ledger: it trains ``steps`` (none: it is killed while starting), then fails."""
    ledger = Ledger(run_dir, rank=0)
    ledger.init_done()
    for step in steps:
        ledger.step_start(step)
        _busy(20_000)
        ledger.step_end(step)
    ledger.failure_detected("SIGKILL")
    ledger.close("failed")


def _busy(n: int) -> int:
    return sum(range(n))


def test_kills_that_strike_a_restart_before_its_first_step_do_not_shorten_the_interval(
    tmp_path: Path,
) -> None:
    """A burst: one kill after 5 steps, two more while the restarts start. The interval plans for 1 failure."""
    run_dir = str(tmp_path)
    _failed_attempt(run_dir, range(1, 6))
    _failed_attempt(run_dir, range(0))
    _failed_attempt(run_dir, range(0))
    acc = account(read_events(run_dir, rank=None))
    assert acc.failures == 3 and acc.mtbf_seconds == pytest.approx(acc.job_seconds / 3)  # the report's figure
    assert interval_mtbf(acc) == pytest.approx(acc.job_seconds)  # one failure lost work since a save

    config = gp.CheckpointConfig(
        root=os.path.join(run_dir, "checkpoints"), strategy="torch_save", every="auto"
    )
    # the ledger's attempts left no crash-loop records: a limit above them lets the fourth one start
    run = gp.Run(run_dir, total_steps=20, checkpoint=config, hang_timeout=None, progress=False, crash_loop=10)
    try:
        run.restore(model=torch.nn.Linear(4, 1))
        policy = run.manager.policy
        assert isinstance(policy, gp.checkpoint.AutoInterval)
        # the fourth attempt plans with the job time so far over the one failure (not over three)
        assert acc.job_seconds <= policy.mtbf <= 2 * acc.job_seconds + 60, (policy.mtbf, acc.job_seconds)
    finally:
        run.close()
