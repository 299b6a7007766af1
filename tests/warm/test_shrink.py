"""Shrink and grow in place under real processes (gloo on CPU, SIGKILL): with no spare ready, the survivors train
on as a smaller group without a process restart or a checkpoint read, and take a spare back at a step boundary
once it is ready. Every sample of the epoch is trained exactly once, and the final state is bit for bit the one
of a run whose world size changed at the same steps through checkpoints (cold relaunches on 3, 2, 1 ranks)."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import goodput.bench
from goodput.drill.drill import DEMO_SCRIPT
from tests.helpers import paths

SCRIPT = paths.script("shrink_train.py")
STEPS = 18
NEVER = "1000000"  # --spare-after-step: the spares never finish their imports within the run


def _launch(
    run_dir: str,
    nproc: int,
    steps: int,
    *extra: str,
    faults: str = "",
    spare_after: str = NEVER,
    hold: str = "",
) -> str:
    cmd = [sys.executable, "-m", "goodput", "launch", "--nproc", str(nproc), "--run-dir", run_dir, *extra]
    cmd += ["--faults", faults, "--", SCRIPT, "--steps", str(steps), "--spare-after-step", spare_after]
    cmd += ["--hold-for-grow", hold, "--step-seconds", "0.05"] if hold else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stderr


def _warm(
    run_dir: str, nproc: int, faults: str, hold: str = "", steps: int = STEPS, spare_after: str = "0"
) -> str:
    """A warm launch with no spare that shrinks at once; ``hold``: the steps before which a shrunk group waits
    for a grow (the replacement's imports; without it the replacement never becomes ready); ``spare_after``:
    with ``hold``, the step a replacement becomes ready after at the earliest (forked, it is ready at once)."""
    extra = ("--restart", "warm", "--spares", "0", "--shrink-after", "0", "--collective-timeout", "4")
    spare_after = spare_after if hold else NEVER
    return _launch(run_dir, nproc, steps, *extra, faults=faults, spare_after=spare_after, hold=hold)


def _reference(run_dir: str, schedule: list[tuple[int, int]], steps: int = STEPS) -> None:
    """An uninterrupted run with a world-size schedule: ``[(first_step, world), ...]``, each part a cold launch
    resuming the previous one's final checkpoint on its own number of ranks."""
    ends = [first - 1 for first, _ in schedule[1:]] + [steps]
    for (_, world), end in zip(schedule, ends, strict=True):
        _launch(run_dir, world, end)


def _lines(pattern: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            found += [json.loads(line) for line in f]
    return found


def _records(run_dir: str) -> list[dict[str, Any]]:
    return _lines(os.path.join(run_dir, "samples", "*.jsonl"))


def _per_step(run_dir: str) -> dict[int, tuple[int, list[int]]]:
    """Each step's world size and its samples (all ranks), checking no sample is trained twice in the run."""
    steps: dict[int, tuple[int, list[int]]] = {}
    every: list[int] = []
    for rec in _records(run_dir):
        world, ids = steps.get(rec["step"], (rec["world"], []))
        assert world == rec["world"], rec
        steps[rec["step"]] = (world, sorted(ids + rec["samples"]))
        every += rec["samples"]
    assert len(every) == len(set(every)), "a sample was trained twice"
    assert sorted(steps) == list(range(1, len(steps) + 1))
    assert all(len(ids) == 12 for _, ids in steps.values()), "the global batch changed"
    return steps


def _schedule(steps: dict[int, tuple[int, list[int]]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for step in sorted(steps):
        if not out or out[-1][1] != steps[step][0]:
            out.append((step, steps[step][0]))
    return out


def _events(run_dir: str, name: str) -> list[dict[str, Any]]:
    return [e for e in _lines(os.path.join(run_dir, "ledger", "*.jsonl")) if e["event"] == name]


def _agent(run_dir: str) -> list[str]:
    with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
        return [json.loads(line)["event"] for line in f]


def _final(run_dir: str) -> dict[str, Any]:
    with open(os.path.join(run_dir, "final.json")) as f:
        return dict(json.load(f))


def _same_as_reference(run_dir: str, ref_dir: str, steps: int = STEPS) -> None:
    per_step = _per_step(run_dir)
    _reference(ref_dir, _schedule(per_step), steps)
    assert _per_step(ref_dir) == per_step
    assert _final(run_dir) == _final(ref_dir)


@pytest.mark.slow
def test_kills_with_no_spare_shrink_3_to_2_to_1_in_place(tmp_path: os.PathLike[str]) -> None:
    run_dir, ref_dir = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "ref")
    _warm(run_dir, 3, "kill@step=6,rank=2;kill@step=12,rank=1")
    assert _agent(run_dir) == ["shrink", "warm_restart_done", "shrink", "warm_restart_done"]
    assert _schedule(_per_step(run_dir)) == [(1, 3), (7, 2), (13, 1)]
    # No process restart: every step at 2 or 1 ranks was trained by a process that trained at 3; and no
    # checkpoint existed to read before the end (one every 1000 steps).
    records = _records(run_dir)
    assert {r["pid"] for r in records if r["world"] < 3} <= {r["pid"] for r in records if r["world"] == 3}
    saved = {os.path.basename(p) for p in glob.glob(os.path.join(run_dir, "checkpoints", "step-*"))}
    assert saved == {f"step-{STEPS}"}  # only the final save of close()
    shrinks = _events(run_dir, "shrink")
    assert sorted((e["generation"], e["rank"], e["world_before"], e["world_after"]) for e in shrinks) == [
        (1, 0, 3, 2),
        (1, 1, 3, 2),
        (2, 0, 2, 1),
    ]
    assert {e["step"] for e in shrinks if e["generation"] == 1} == {7}
    assert all(e["batch_rule"] == "per_rank_batch" and e["seconds"] >= 0 for e in shrinks)
    assert {e["failed_ranks"][0] for e in shrinks} == {2, 1}
    starts = _events(run_dir, "attempt_start")
    assert {(e["world_size"], e["reserved_world"]) for e in starts} == {(3, 3), (2, 3), (1, 3)}
    _same_as_reference(run_dir, ref_dir)


@pytest.mark.slow
def test_a_second_failure_during_a_shrink_shrinks_again(tmp_path: os.PathLike[str]) -> None:
    run_dir, ref_dir = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "ref")
    # rank 1 dies inside the shrink's recovery (generation 1): the last survivor goes on alone, from step 4
    _warm(run_dir, 3, "kill@step=4,rank=2;kill@phase=restore,rank=1,attempt=1")
    events = _agent(run_dir)
    assert events[:2] == ["shrink", "shrink"] and "cold_restart" not in events, events
    assert _schedule(_per_step(run_dir)) == [(1, 3), (5, 1)]
    _same_as_reference(run_dir, ref_dir)


@pytest.mark.slow
def test_a_returning_spare_grows_the_group_back(tmp_path: os.PathLike[str]) -> None:
    run_dir, ref_dir = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "ref")
    # the replacement started at the shrink finishes its imports; the group grows back (before step 8 the
    # survivor waits for it, so that the run does not end first). When the grow lands is the replacement's
    # import time against the survivor's steps: any step after the shrink's first (step 6, 7, 8 or later)
    _warm(run_dir, 2, "kill@step=4,rank=1", hold="8", steps=24)
    assert _agent(run_dir) == ["shrink", "warm_restart_done", "grow", "warm_restart_done"]
    schedule = _schedule(_per_step(run_dir))
    assert schedule[:2] == [(1, 2), (5, 1)] and schedule[2][1] == 2 and schedule[2][0] > 5, schedule
    assert len(schedule) == 3
    grows = _events(run_dir, "grow")
    assert sorted((e["rank"], e["world_before"], e["world_after"], e["joined"]) for e in grows) == [
        (0, 1, 2, 1),
        (1, 1, 2, 1),
    ]
    assert {e["step"] for e in grows} == {schedule[2][0]}
    # the newcomer ended as any rank once the grow had recovered: it closed its ledger (it was not stopped
    # with the spares when the old rank finished first)
    ends = {(e["rank"], e["attempt"]): e["status"] for e in _events(run_dir, "attempt_end")}
    last = {rank: max(a for r, a in ends if r == rank) for rank, _ in ends}
    assert {rank: ends[rank, attempt] for rank, attempt in last.items()} == {0: "ok", 1: "ok"}, ends
    # one numbering for the job: the newcomer opens the grown generation's attempt, not one more than its rank
    # number's last (rank 1 has no attempt of the shrunk generation)
    starts = sorted((e["attempt"], e["rank"], e["world_size"]) for e in _events(run_dir, "attempt_start"))
    assert starts == [(0, 0, 2), (0, 1, 2), (1, 0, 1), (2, 0, 2), (2, 1, 2)], starts
    _same_as_reference(run_dir, ref_dir, 24)


@pytest.mark.slow
def test_a_newcomer_killed_while_it_restores_shrinks_and_grows_again(tmp_path: os.PathLike[str]) -> None:
    run_dir = os.path.join(tmp_path, "run")
    _warm(run_dir, 2, "kill@step=4,rank=1;kill@phase=restore,rank=1,attempt=2", hold="8,14", steps=24)
    events = _agent(run_dir)
    assert events[:3] == ["shrink", "warm_restart_done", "grow"] and "cold_restart" not in events, events
    assert events[3] == "shrink"  # the newcomer died restoring: the survivor goes on alone again
    steps = _per_step(run_dir)
    assert steps[24][0] == 2, "a second replacement grew the group back"


@pytest.mark.slow
def test_a_sharded_model_does_not_shrink_but_takes_a_new_process(tmp_path: os.PathLike[str]) -> None:
    """FSDP2 without replicas: no survivor holds the whole model, so the job cannot go on smaller; the failed
    rank is given a fresh process and the state comes from the newest checkpoint, as without --shrink-after."""
    run_dir = str(tmp_path)
    script = os.path.join(os.path.dirname(goodput.bench.__file__), "_restart_train.py")
    cmd = [sys.executable, "-m", "goodput", "launch", "--restart", "warm", "--nproc", "2", "--spares", "0"]
    cmd += ["--shrink-after", "0", "--collective-timeout", "4", "--run-dir", run_dir]
    cmd += ["--faults", "kill@step=8,rank=1", "--", script, "--steps", "12", "--every", "5", "--fsdp"]
    cmd += ["--strategy", "dcp", "--global-batch", "16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
        events = [json.loads(line) for line in f]
    assert [e["event"] for e in events] == ["warm_restart", "warm_restart_done"], events
    assert [h["rank"] for h in events[0]["handed"]] == [1]
    restored = [e["step"] for e in _events(run_dir, "restore_end") if e["attempt"] == 1]
    assert restored == [5, 5]  # both ranks of the new generation read the checkpoint of step 5


_TWO_NODES = ("--restart", "warm", "--shrink-after", "5", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1")


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--shrink-after", "5"), "--restart warm"),
        (
            (*_TWO_NODES, "--min-world", "3"),
            "--min-world 3",
        ),
        (("--restart", "warm", "--nproc", "2", "--shrink-after", "5", "--min-world", "3"), "--min-world 3"),
    ],
)
def test_shrinking_where_it_cannot_work_is_refused_in_one_line(
    tmp_path: os.PathLike[str], flags: tuple[str, ...], named: str
) -> None:
    cmd = [sys.executable, "-m", "goodput", "launch", "--run-dir", str(tmp_path), *flags, "--", SCRIPT]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and named in proc.stderr, proc.stderr


def _stalled_at(run_dir: str, step: int) -> set[int]:
    """The ranks whose ledger (so far: it is being written) has a save of ``step`` begun."""
    ranks = set()
    for path in glob.glob(os.path.join(run_dir, "ledger", "*.jsonl")):
        with open(path) as f:
            for line in f:
                if f'"step": {step}' in line and '"checkpoint_stall"' in line and '"start"' in line:
                    ranks.add(json.loads(line)["rank"])
    return ranks


def test_a_shrink_while_the_survivors_wait_for_a_held_upload_leaves_it_behind(tmp_path: Path) -> None:
    """The save of step 24 (``dcp_async``, the demo's, every 4 steps) is held on rank 1 for 20 s after its write,
    as a slow store, or a collective waiting on a peer that left, would hold it; at step 28 every rank waits
    for it (one save in flight), and rank 2 is SIGKILLed then. The survivors leave that save behind and shrink
    at once: they do not wait out the hold (which made a survivor miss the next generation, and the job
    restart cold after the 30 s re-form timeout, when a gloo send held it), and the thread left behind holds
    neither the next generation nor the process at its exit."""
    run_dir = str(tmp_path / "run")
    hold = "slow@phase=async_upload,step=24,rank=1,seconds=20"
    cmd = [sys.executable, "-m", "goodput", "launch", "--nproc", "3", "--run-dir", run_dir]
    cmd += ["--restart", "warm", "--spares", "0", "--shrink-after", "0", "--faults", hold]
    cmd += ["--", DEMO_SCRIPT, "--steps", "60", "--global-batch", "24"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while _stalled_at(run_dir, 28) != {0, 1, 2}:  # the ledgers flush every 0.5 s
            assert proc.poll() is None and time.monotonic() < deadline, "no rank reached step 28's save"
            time.sleep(0.1)  # polling for a condition, not a synchronisation by time
        (pid_file,) = glob.glob(os.path.join(run_dir, "launches", "*", "pids", "rank-2"))
        with open(pid_file) as f:
            os.kill(int(f.read()), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-4000:]
    assert _agent(run_dir)[:2] == ["shrink", "warm_restart_done"], _agent(run_dir)
    assert "cold_restart" not in _agent(run_dir)
    (shrink,) = [e for e in _events(run_dir, "shrink") if e["rank"] == 1]
    held = [e for e in _events(run_dir, "fault_injected") if e["rank"] == 1 and e["action"] == "slow"]
    assert held and shrink["wall"] < held[0]["wall"] + 10, (held, shrink)  # not after the 20 s hold
