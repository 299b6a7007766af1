"""Warm restarts under real processes (gloo on CPU): a SIGKILLed, raising or hung rank is replaced by a hot
spare while the survivor keeps its process, and the run ends bit for bit like an uninterrupted one, each sample
trained exactly once. A failure during the warm restart itself ends in a cold restart, not a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import goodput.bench
from tests.helpers.launching import warm_launch

SCRIPT = os.path.join(os.path.dirname(goodput.bench.__file__), "_restart_train.py")
STEPS = "40"


def _jsonl(folder: str) -> list[str]:
    """The ledger's JSON-lines files in ``folder`` (its step records are binary ``.steps`` files beside them)."""
    return sorted(name for name in os.listdir(folder) if name.endswith(".jsonl"))


def _launch(
    run_dir: str, faults: str = "", *extra: str, hang_timeout: str = "60", script_args: tuple[str, ...] = ()
) -> None:
    cmd = warm_launch(run_dir)
    cmd += ["--faults", faults, "--collective-timeout", "4", *extra, "--", SCRIPT, "--steps", STEPS]
    cmd += ["--every", "10", "--hang-timeout", hang_timeout, *script_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _verify_warm(*args: str) -> subprocess.CompletedProcess[str]:
    """``goodput verify-resume --restart warm ARGS``."""
    cmd = [sys.executable, "-m", "goodput", "verify-resume", "--restart", "warm", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _lines(path: str) -> Iterator[dict[str, Any]]:
    with open(path) as f:
        for line in f:
            yield json.loads(line)


def _warm_restarts(run_dir: str) -> list[dict[str, Any]]:
    """Every rank's ``warm_restart`` events in the run's ledger."""
    folder = os.path.join(run_dir, "ledger")
    return [
        e
        for name in _jsonl(folder)
        for e in _lines(os.path.join(folder, name))
        if e["event"] == "warm_restart"
    ]


def _trained(run_dir: str) -> tuple[dict[tuple[int, int], list[int]], dict[int, list[int]]]:
    """The samples each (rank, step) was last trained on, and the pids that trained each rank's steps."""
    samples: dict[tuple[int, int], list[int]] = {}
    pids: dict[int, list[int]] = {}
    for rank in (0, 1):
        for rec in _lines(os.path.join(run_dir, "samples", f"rank-{rank}.jsonl")):
            samples[(rank, rec["step"])] = rec["samples"]
            if rec["pid"] not in pids.setdefault(rank, []):
                pids[rank].append(rec["pid"])
    return samples, pids


def _agent(run_dir: str) -> list[dict[str, Any]]:
    return list(_lines(os.path.join(run_dir, "warm", "agent.jsonl")))


def _final(run_dir: str) -> dict[str, Any]:
    with open(os.path.join(run_dir, "final.json")) as f:
        return dict(json.load(f))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> str:
    run_dir = str(tmp_path_factory.mktemp("baseline"))
    _launch(run_dir)
    return run_dir


def _assert_warm_and_identical(run_dir: str, baseline: str, restored: int = 20) -> None:
    events = _agent(run_dir)
    assert [e["event"] for e in events] == ["warm_restart", "warm_restart_done"], events
    assert events[0]["failed"] == [1]
    spare_pid = events[0]["handed"][0]["pid"]
    assert events[0]["handed"][0]["spare"] is not None
    samples, pids = _trained(run_dir)
    base_samples, _ = _trained(baseline)
    # The survivor kept its process; rank 1 ran in its first process, then in the spare.
    assert len(pids[0]) == 1
    assert len(pids[1]) == 2 and pids[1][1] == spare_pid
    # Exactly once: every step of every rank trained on the same samples as the uninterrupted run, and no
    # sample twice.
    assert samples == base_samples
    every = [i for ids in samples.values() for i in ids]
    assert len(every) == len(set(every)) == 2 * int(STEPS) * 8
    assert _final(run_dir) == _final(baseline)
    # Both ranks recorded the warm restart's parts; the survivor restored the step the killed rank finished.
    warm = _warm_restarts(run_dir)
    assert sorted(e["role"] for e in warm) == ["replacement", "survivor"]
    assert {e["restored_step"] for e in warm} == {restored}


@pytest.mark.slow
def test_sigkill_of_one_rank_restarts_warm(tmp_path: os.PathLike[str], baseline: str) -> None:
    run_dir = str(tmp_path)
    # 10 ms of compute per step: the kill comes ~0.3 s after the first step, after the agent's 0.1 s tick has
    # started the first spare (a failure before that is answered cold, by design: docs/warm-restarts.md)
    _launch(run_dir, "kill@step=20,rank=1", script_args=("--step-seconds", "0.01"))
    _assert_warm_and_identical(run_dir, baseline)
    # The hand-over logs the agent's store operations so far: at least its own five writes (a generation
    # number, the old generation's end, the spare's assignment, the new generation's info and number).
    ops = _agent(run_dir)[0]["store_ops"]
    assert set(ops) == {"reads", "writes", "waits"} and ops["writes"] >= 5 and ops["reads"] > 0, ops


@pytest.mark.slow
def test_spares_forked_from_the_template_take_two_killed_ranks_and_the_run_ends_bitwise(
    tmp_path: os.PathLike[str], baseline: str
) -> None:
    """The second kill is handed to a spare the template forked after the first hand-over.

    Each spare goes on with the live goodput of the rank that sent it the state (the progress line and the
    exporters show the job's figure, not a window of the spare's first steps): the second spare's totals at its
    first step are rank 0's from before both kills, carried through the first spare."""
    run_dir = str(tmp_path)
    faults = "kill@step=20,rank=1; kill@step=35,rank=0"
    _launch(run_dir, faults, script_args=("--step-seconds", "0.05"))
    events = _agent(run_dir)
    assert [e["event"] for e in events] == ["warm_restart", "warm_restart_done"] * 2, events
    handed = [e["handed"][0] for e in events if e["event"] == "warm_restart"]
    assert [(h["rank"], h["forked"]) for h in handed] == [(1, True), (0, True)]
    samples, pids = _trained(run_dir)
    assert pids[1][1] == handed[0]["pid"] and pids[0][1] == handed[1]["pid"]
    assert samples == _trained(baseline)[0]
    assert _final(run_dir) == _final(baseline)
    rank0 = list(_lines(os.path.join(run_dir, "samples", "rank-0.jsonl")))
    killed = [r["live"] for r in rank0 if r["pid"] == pids[0][0]]
    spare = next(r["live"] for r in rank0 if r["pid"] == pids[0][1])  # before its first step's own compute
    assert abs(spare["origin_wall"] - killed[0]["origin_wall"]) < 0.5, (killed[0], spare)
    assert spare["useful"] >= 0.5 * killed[-1]["useful"] > 0, (killed[-1], spare)


@pytest.mark.slow
def test_a_rank_killed_inside_its_step_restarts_warm_with_every_sample_once(
    tmp_path: os.PathLike[str], baseline: str
) -> None:
    """A SIGKILL between the gradients' all-reduce and the optimizer step, not at a step boundary (where the
    fault plan and verify-resume kill): the group adopts the newest step a survivor holds (20, or 19 when the
    survivor's optimizer step came after the agent's word), the data stay exactly-once, and the run ends bit for
    bit like the uninterrupted one: the killed rank recorded its RNG when its backward began, before its
    gradients left it, so its replacement finds the record of whichever step the group adopts."""
    run_dir = str(tmp_path)
    _launch(run_dir, script_args=("--step-seconds", "0.01", "--die-mid-step", "20"))
    events = _agent(run_dir)
    assert [e["event"] for e in events] == ["warm_restart", "warm_restart_done"], events
    assert events[0]["failed"] == [1]
    samples, pids = _trained(run_dir)
    base, _ = _trained(baseline)
    assert len(pids[0]) == 1 and len(pids[1]) == 2
    # Rank 1's step 20 is logged only if it was redone (the log is written after the optimizer step); when the
    # survivor's step 20 was adopted, those samples were trained through the survivor's all-reduce.
    assert {k: v for k, v in samples.items() if k != (1, 20)} == {
        k: v for k, v in base.items() if k != (1, 20)
    }
    assert samples.get((1, 20), base[(1, 20)]) == base[(1, 20)]
    every = [i for ids in samples.values() for i in ids]
    assert len(every) == len(set(every))
    assert _final(run_dir) == _final(baseline)
    warm = _warm_restarts(run_dir)
    assert len({e["restored_step"] for e in warm}) == 1 and warm[0]["restored_step"] in (19, 20)


@pytest.mark.slow
def test_a_rank_killed_after_its_optimizer_step_restarts_warm_bitwise(
    tmp_path: os.PathLike[str], baseline: str
) -> None:
    """A SIGKILL after the optimizer step but before ``step_done``: the rank recorded its RNG just before the
    optimizer step, as step 20, so whichever step the group adopts, its replacement finds that step's record and
    the run ends bit for bit like the uninterrupted one."""
    run_dir = str(tmp_path)
    _launch(run_dir, script_args=("--step-seconds", "0.01", "--die-after-optimizer", "20"))
    events = _agent(run_dir)
    assert [e["event"] for e in events] == ["warm_restart", "warm_restart_done"], events
    samples, pids = _trained(run_dir)
    base, _ = _trained(baseline)
    assert len(pids[0]) == 1 and len(pids[1]) == 2
    assert {k: v for k, v in samples.items() if k != (1, 20)} == {
        k: v for k, v in base.items() if k != (1, 20)
    }
    assert _final(run_dir) == _final(baseline)


@pytest.mark.slow
def test_exception_on_one_rank_restarts_warm(tmp_path: os.PathLike[str], baseline: str) -> None:
    run_dir = str(tmp_path)
    # 10 ms of compute per step, as in the SIGKILL test: the failure comes after the first spare has started
    _launch(run_dir, "raise@step=20,rank=1", script_args=("--step-seconds", "0.01"))
    _assert_warm_and_identical(run_dir, baseline)


@pytest.mark.slow
def test_hung_rank_is_replaced_and_survivor_restarts_warm(tmp_path: os.PathLike[str], baseline: str) -> None:
    run_dir = str(tmp_path)
    # The survivor's collective fails after 4 s; the hung rank's watchdog ends it after 16 s: longer than the
    # survivor's collective and re-form timeouts together (4 + 10 s), as with the defaults (30 + 30 against 300 s),
    # so the survivor must wait for the hung rank's end rather than give up and turn the hang into a cold restart.
    # The hang falls between the saves at 10 and 20.
    _launch(run_dir, "hang@step=15,rank=1", "--reform-timeout", "10", hang_timeout="16")
    assert [e["event"] for e in _agent(run_dir) if e["event"].endswith("_restart")] == ["warm_restart"]
    _assert_warm_and_identical(run_dir, baseline, restored=15)


@pytest.mark.slow
def test_spare_killed_while_restoring_falls_back_to_a_cold_restart(
    tmp_path: os.PathLike[str], baseline: str
) -> None:
    run_dir = str(tmp_path)
    # Generation 1 is the warm restart; the spare that took rank 1 dies inside its restore.
    _launch(run_dir, "kill@step=20,rank=1; kill@phase=restore,rank=1,attempt=1")
    events = _agent(run_dir)
    assert [e["event"] for e in events] == ["warm_restart", "cold_restart"], events
    assert events[1]["reason"] == "a failure during a warm restart"
    samples, pids = _trained(run_dir)
    # Cold: both ranks are new processes after the fallback; the data are still trained exactly once.
    assert len(pids[0]) == 2 and len(pids[1]) == 2
    assert samples == _trained(baseline)[0]
    assert _final(run_dir)["step"] == int(STEPS)


@pytest.mark.slow
def test_two_nodes_a_killed_worker_leaves_the_other_nodes_worker_running(
    tmp_path: os.PathLike[str], baseline: str
) -> None:
    """Two agents (one per "node", one rank each) meet through the c10d rendezvous on 127.0.0.1."""
    from goodput.testing import free_port

    run_dir = str(tmp_path)
    endpoint = f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "goodput", "launch", "--restart", "warm", "--nnodes", "2", "--nproc", "1"]
    cmd += [
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        "two-nodes",
        "--run-dir",
        run_dir,
        "--collective-timeout",
        "4",
    ]
    # 10 ms of compute per step, as in the one-node SIGKILL test: the kill comes after the first spare started
    cmd += ["--faults", "kill@step=20,rank=1", "--", SCRIPT, "--steps", STEPS, "--every", "10"]
    cmd += ["--step-seconds", "0.01"]
    agents = [
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    try:
        errors = [agent.communicate(timeout=150)[1] for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    assert [agent.returncode for agent in agents] == [0, 0], errors[0][-2000:] + errors[1][-2000:]
    _assert_warm_and_identical(run_dir, baseline)


def test_peer_failures_are_told_from_a_ranks_own_errors() -> None:
    import torch.distributed as dist

    from goodput.faults import InjectedFault
    from goodput.job.folder import is_peer_failure

    gloo = RuntimeError("[pair.cc:537] Read error [127.0.0.1]:1: Connection reset by peer.")
    assert is_peer_failure(gloo)
    assert is_peer_failure(dist.DistBackendError("NCCL communicator was aborted"))
    wrapped = ValueError("save failed")
    wrapped.__cause__ = gloo
    assert is_peer_failure(wrapped)
    assert not is_peer_failure(InjectedFault("injected fault: raise step at step 3 on rank 1"))
    assert not is_peer_failure(RuntimeError("shape mismatch in my model"))


def test_warm_restart_options_are_checked_in_one_line() -> None:
    cmd = [sys.executable, "-m", "goodput", "launch", "--restart", "warm", "--spares", "-1", "--", "train.py"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--spares" in proc.stderr
    cmd[cmd.index("--spares") : cmd.index("--spares") + 2] = [
        "--nnodes",
        "1:2",
        "--rdzv-endpoint",
        "127.0.0.1:1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--nnodes" in proc.stderr


@pytest.mark.slow
def test_sharded_model_restarts_warm_from_the_newest_checkpoint(
    tmp_path: os.PathLike[str], baseline: str
) -> None:
    """FSDP2 holds no full replica on any rank: the warm restart keeps the processes but restores the checkpoint."""
    run_dir = str(tmp_path)
    _launch(run_dir, "kill@step=20,rank=1", script_args=("--fsdp", "--strategy", "dcp"))
    events = _agent(run_dir)
    assert [e["event"] for e in events] == ["warm_restart", "warm_restart_done"], events
    samples, pids = _trained(run_dir)
    assert len(pids[0]) == 1 and len(pids[1]) == 2
    assert samples == _trained(baseline)[0]  # steps 11-20 redone on the same samples
    restored = [
        e["step"]
        for name in _jsonl(os.path.join(run_dir, "ledger"))
        for e in _lines(os.path.join(run_dir, "ledger", name))
        if e["event"] == "restore_end" and e["attempt"] == 1
    ]
    assert restored == [10, 10]  # the save at step 20 never happened: the kill came first


@pytest.mark.slow
def test_verify_resume_under_warm_restarts_passes_and_says_how_it_restarted(
    tmp_path: os.PathLike[str],
) -> None:
    """``goodput verify-resume --restart warm``: the built-in training killed three times (one kill inside a
    checkpoint write) restarts warm each time and still ends bit for bit like the uninterrupted run."""
    proc = _verify_warm(
        "--steps", "24", "--every", "4", "--kills", "3", "--seed", "2", "--work-dir", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "IDENTICAL" in proc.stdout and "after 3 restarts (3 warm, 0 cold)" in proc.stdout, proc.stdout
    events = _agent(os.path.join(str(tmp_path), "interrupted"))
    assert [e["event"] for e in events].count("warm_restart_done") == 3


@pytest.mark.slow
def test_verify_resume_of_a_script_kills_a_rank_inside_a_step_its_peer_completes(
    tmp_path: os.PathLike[str],
) -> None:
    """``goodput verify-resume --restart warm --kills 3 -- script``: the third kill lands right after one rank's
    optimizer step, whose gradients are already in its peer's step. The peer completes the step and the job
    adopts it: the dead rank never recorded the step done, only its batch (pending), and the verdict compares
    that batch's samples instead of calling the step missing."""
    from goodput.drill import demo_train
    from goodput.verify.records import read_records

    work = str(tmp_path)
    proc = _verify_warm(
        "--kills", "3", "--seed", "1", "--work-dir", work, "--", demo_train.__file__, "--steps", "24"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "kill@phase=optimizer_step," in proc.stdout and "IDENTICAL" in proc.stdout, proc.stdout
    records = read_records(os.path.join(work, "interrupted"))
    adopted = [(r.rank, r.step) for steps in records.steps.values() for r in steps.values() if r.pending]
    assert len(adopted) == 1, adopted  # the dead rank's step, completed by its peer
    rank, step = adopted[0]
    assert all(not steps[step].pending for r, steps in records.steps.items() if r != rank)


@pytest.mark.slow
def test_a_survivor_whose_gradients_carry_the_numeric_guard_s_word_never_steps_alone(
    tmp_path: os.PathLike[str],
) -> None:
    """The numeric guard sends its word with DDP's first gradient bucket. When the peer is SIGKILLed after step 10,
    the survivor's all-reduce of step 11 fails, and that failure must reach DDP: swallowed, the survivor would
    step on its own gradients, and the warm restart would adopt that step 11 and hand it to the replacement."""
    from goodput.drill import demo_train
    from goodput.verify.records import read_records

    run_dir = str(tmp_path)
    cmd = warm_launch(run_dir)
    cmd += ["--faults", "kill@step=10,rank=0", "--", demo_train.__file__, "--steps", "16"]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=150, env={**os.environ, "GOODPUT_RECORDS": "1"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_records(run_dir)
    done_in_first_attempt = [
        max(r.step for r in steps.values() if r.attempt == 0 and not r.pending)
        for steps in records.steps.values()
    ]
    assert done_in_first_attempt == [10, 10]
    warm = _warm_restarts(run_dir)
    assert {e["restored_step"] for e in warm} == {10}, warm
