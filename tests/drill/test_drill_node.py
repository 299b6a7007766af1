"""The drill's node scenarios (``--nnodes 2``: two ``goodput launch`` agents on this machine, one rank each, real
torchrun c10d rendezvous on 127.0.0.1): every process of one node SIGKILLed at once. The survivor goes on when
the rendezvous survives, stops with exit 75 and one line when it does not (its store's host lost, or the node
never comes back within --rdzv-timeout), and the relaunch resumes exactly; no process is left."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from goodput.drill.node import TwoNodeJob, free_port, lose_node, restored_steps, until_step
from goodput.drill.process import said
from goodput.drill.runs import finish, processes_of
from goodput.drill.scenario import Reference, registered
from goodput.job.codes import EXIT_PREEMPTED
from tests.helpers import drill

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("scenario", "injected", "lost", "log", "times"),
    [
        (
            "node-store",
            f"node 1 stopped, exit {EXIT_PREEMPTED}",
            "the rendezvous lost the node that hosts its store",
            "node-1.log",
            1,
        ),
        ("node", "node 0 went on, completed", "the rendezvous lost", "node-0.log", 0),
    ],
    ids=["store-host-lost-stops-with-75-and-resumes", "other-node-lost-goes-on-once-back"],
)
def test_losing_a_node_the_job_completes_exactly_once_from_a_reference_save(
    drill_reference: Reference, tmp_path: Path, scenario: str, injected: str, lost: str, log: str, times: int
) -> None:
    result = registered()[scenario].run(drill.context(str(tmp_path), drill_reference, nnodes=2))
    assert result.met, result
    assert result.exactly_once and result.identical and result.outcome == "completed"
    assert injected in result.injected, result.injected
    run_dir = str(tmp_path / "run")
    assert said(run_dir, lost, log=log) == times
    restored = restored_steps(run_dir)
    assert restored and all(step in drill_reference.saves for step in restored), restored
    assert processes_of(run_dir) == []


def test_a_node_that_never_comes_back_stops_the_survivor_within_the_rendezvous_timeout(
    drill_reference: Reference, tmp_path: Path
) -> None:
    context = drill.context(str(tmp_path), drill_reference, nnodes=2)
    run_dir = str(tmp_path / "run")
    job = TwoNodeJob(context, run_dir, f"127.0.0.1:{free_port()}", rdzv_timeout=10)
    assert until_step(job, 2, durable=False)  # nothing resumes here: no checkpoint needed
    lose_node(job.procs[1])
    lost = time.monotonic()
    status = finish(job.procs[0], job.started).status
    waited = time.monotonic() - lost
    assert status == EXIT_PREEMPTED, (tmp_path / "run" / "node-0.log").read_text()[-3000:]
    assert 10 <= waited < 10 + 15, waited  # torchrun's own join timeout is 600 s
    assert said(run_dir, "none came back within --rdzv-timeout 10s", log="node-0.log") == 1
    assert processes_of(run_dir) == []
