"""``goodput drill --soak --nnodes 2`` from the user's side: the job as two ``goodput launch`` node commands on this
machine (c10d rendezvous on 127.0.0.1), a rank killed on either node, node 1 lost whole (its launcher, agent, ranks
and spares SIGKILLed at once) and its command run again; every check holds, the table has a
``node`` row, and every step trained the uninterrupted run's global batch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.drill.drill import DEMO_SCRIPT
from goodput.drill.soak_nodes import demo_global_batch
from goodput.drill.soak_plan import REPLAY_FILE, SoakFault, SoakPlan

pytestmark = pytest.mark.slow


def test_a_soak_on_two_nodes_survives_a_node_lost_and_its_command_run_again(tmp_path: Path) -> None:
    # rank 3 is node 1's; after node 1 is lost the job trains on node 0's ranks 0 and 1 until node 1's command,
    # run again, grows it back: the fault after the loss hits a rank that exists either way, late enough that
    # the spare taking it rises once before the job ends (a hot spare lives from the start: the leak rule judges
    # it, and a rank taken and a generation after it in the next warm-up would read as two rises)
    schedule = (
        SoakFault(kind="kill", seconds=1.0, step=150, rank=3),
        SoakFault(kind="nan", seconds=2.0, step=300, rank=1),
        SoakFault(kind="node", seconds=3.0, step=500),
        SoakFault(kind="kill", seconds=4.0, step=1050, rank=0),
    )
    plan = SoakPlan(seed=0, mtbf=10.0, seconds=39.0, steps=1300, step_seconds=0.03, schedule=schedule)
    script = [DEMO_SCRIPT, "--steps", str(plan.steps), "--global-batch", str(demo_global_batch(2))]
    (tmp_path / "given.json").write_text(json.dumps({**plan.to_json(), "script": script}))
    command = [sys.executable, "-m", "goodput", "drill", "--soak", "--replay", "given.json", "--nnodes", "2"]
    command += ["--reference", "--work-dir", str(tmp_path / "work")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert not (tmp_path / REPLAY_FILE).exists() and "every check held" in proc.stdout
    table = proc.stdout.split("work lost s total/max\n", 1)[1].split("\n\n", 1)[0]
    rows = {m[1]: (int(m[2]), int(m[3])) for m in re.finditer(r"^(\w+) +(\d+) +(\d+) ", table, re.M)}
    assert (rows["kill"], rows["node"]) == ((2, 2), (1, 1)), rows  # the node's shrink is not taken for a kill
    assert rows["nan"][1] >= 1, rows
    assert "node 1's command again" in proc.stderr and "2 ranks x 2 node(s)" in proc.stderr
    # the world changed: the global batches are compared with the uninterrupted run, not the final state
    assert "every step's global batch as the uninterrupted run's (1300 steps, on 2 and " in proc.stdout
    assert "categories tile it" in proc.stdout


def test_a_node_lost_near_the_end_comes_back_as_the_job_completes(tmp_path: Path) -> None:
    # node 1 is lost 250 steps (about 8 s) before the end: its command, run again, reaches the rendezvous as the
    # job ends (mostly: its agent is admitted, finds the job done, exit 0) or after node 0 closed the store
    # (exit 75: it found no job to join); each way the job completes and nothing of the lost node is left behind.
    schedule = (
        SoakFault(kind="kill", seconds=1.0, step=150, rank=3),
        SoakFault(kind="node", seconds=3.0, step=750),
    )
    plan = SoakPlan(seed=0, mtbf=10.0, seconds=30.0, steps=1000, step_seconds=0.03, schedule=schedule)
    script = [DEMO_SCRIPT, "--steps", str(plan.steps), "--global-batch", str(demo_global_batch(2))]
    (tmp_path / "given.json").write_text(json.dumps({**plan.to_json(), "script": script}))
    command = [sys.executable, "-m", "goodput", "drill", "--soak", "--replay", "given.json", "--nnodes", "2"]
    command += ["--work-dir", str(tmp_path / "work")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "every check held" in proc.stdout and "node 1's command again" in proc.stderr, proc.stderr[-3000:]


def test_a_node_fault_on_one_node_is_refused_in_one_line(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "goodput", "drill", "--soak", "1m", "--kinds", "kill,node"]
    proc = subprocess.run(
        [*command, "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "node" in last and "1 node(s)" in last, last
