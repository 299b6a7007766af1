"""Hot spares forked from the node's template, with real processes: a forked spare is the agent's own child, in
a session of its own, with the environment and streams the agent asked for, a freshly seeded ``random``, no
thread and torch's thread count of a spawned process; the agent reads its exit status. A template whose
imports start a thread refuses to fork, and the agent records it and spawns instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import goodput.bench
from goodput.warm.template import script_imports
from tests.helpers.launching import warm_launch

# The agent's side, in a process of its own (it becomes a child subreaper, which pytest must not).
_AGENT = textwrap.dedent(
    """
    import json, os, sys
    from goodput.launch.launcher import LaunchConfig
    from goodput.warm.forked import TemplateForks
    events = []
    forks = TemplateForks(LaunchConfig(script=tuple(sys.argv[1:])), lambda event, **f: events.append(event))
    forks.settled(lambda: dict(os.environ), False)
    spares = []
    if forks.finish(300):
        for name in ("a", "b"):
            env = dict(os.environ, SPARE_NAME=name)
            spares.append(forks.fork(name, env))
    results = []
    for spare in spares:
        failure = spare.wait(120).failures[0]
        results.append({"pid": spare.pid, "exitcode": failure.exitcode})
    forks.close()
    print(json.dumps({"agent": os.getpid(), "spares": results, "events": events}))
    """
)

_SPARE = textwrap.dedent(
    """
    import json, os, random, sys, threading
    import torch
    facts = {
        "name": os.environ["SPARE_NAME"], "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0),
        "random": random.random(), "threads": threading.active_count(),
        "tasks": len(os.listdir("/proc/self/task")), "torch_threads": torch.get_num_threads(),
        "argv": sys.argv[1:], "main": __name__,
    }
    with open(os.path.join(os.path.dirname(__file__), facts["name"] + ".json"), "w") as f:
        json.dump(facts, f)
    print("spare", facts["name"], "says hello")
    sys.exit(3)
    """
)


def _agent(script: Path, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _AGENT, str(script), "--flag"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def test_a_forked_spare_is_the_agents_child_with_its_own_session_streams_and_seeds(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SPARE)
    launch = tmp_path / "launch"
    launch.mkdir()
    out = _agent(script, {"GOODPUT_LAUNCH_DIR": str(launch), "OMP_NUM_THREADS": "1"})
    assert out["events"] == []
    facts = [json.loads((tmp_path / f"{name}.json").read_text()) for name in ("a", "b")]
    assert [s["exitcode"] for s in out["spares"]] == [3, 3]
    assert [f["pid"] for f in facts] == [s["pid"] for s in out["spares"]]
    for fact in facts:
        assert fact["ppid"] == out["agent"] and fact["sid"] == fact["pid"]
        assert fact["threads"] == 1 and fact["tasks"] == 1  # torch's pool starts only on a tensor operation
        assert fact["argv"] == ["--flag"] and fact["main"] == "__main__"
    assert facts[0]["random"] != facts[1]["random"]
    spawned = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert [f["torch_threads"] for f in facts] == [int(spawned.stdout)] * 2
    logs = {p.parent.parent.parent.parent.name: p.read_text() for p in launch.glob("logs/*/*/*/0/stdout.log")}
    assert logs["a"] == "spare a says hello\n" and logs["b"] == "spare b says hello\n"


def test_a_template_whose_imports_start_a_thread_refuses_and_spares_are_spawned(tmp_path: Path) -> None:
    (tmp_path / "busy.py").write_text(
        "import threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()\n"
    )
    script = tmp_path / "train.py"
    script.write_text("import busy\n")
    out = _agent(script, {})
    assert out["spares"] == [] and out["events"] == ["template_failed"]


def test_a_scripts_top_level_imports_are_what_the_template_preloads() -> None:
    source = "import os, a.b as c\nfrom d.e import f\nfrom . import g\nif x:\n    import h\ndef i():\n    import j\n"
    assert script_imports(source) == ["os", "a.b", "d.e"]


def test_a_spare_adopted_by_another_process_than_the_agent_ends_at_once() -> None:
    # the agent ended while the spare was forked: its middle process exited and someone else (not the agent, not
    # the middle) adopted it; it must end now, not after waiting out the adoption deadline (10 s), or it outlives
    # a SIGKILLed launcher (seen once in test_launcher_sigkill under two test workers)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # an agent pid that no longer runs
    code = (
        "import goodput.warm.template as t; "
        f"t._middle = -1; t._become_spare({{'env': {{}}}}, agent={dead.pid})"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    assert proc.wait(timeout=5) == 1


_WORKER = textwrap.dedent(
    """
    import json, os, runpy, sys
    from goodput.ledger.live import process_start_wall
    facts = {
        "torch": "torch" in sys.modules, "ppid": os.getppid(), "started": process_start_wall(),
        "cmdline": open("/proc/self/cmdline", "rb").read().decode().split("\\0"),
    }
    with open(os.path.join(os.environ["GOODPUT_RUN_DIR"], f"facts-{os.environ['RANK']}.json"), "w") as f:
        json.dump(facts, f)
    sys.argv[0] = SCRIPT
    runpy.run_path(SCRIPT, run_name="__main__")
    """
)


@pytest.mark.slow
def test_the_first_workers_are_forked_from_the_template_and_their_attempts_begin_before_its_imports(
    tmp_path: Path,
) -> None:
    # the node imports once: its first workers find torch imported as their script begins, are the agent's own
    # children, and their ledger counts the template's imports as the attempt's, from when the agent set out
    script = tmp_path / "train.py"
    script.write_text(
        f"SCRIPT = {str(Path(goodput.bench.__file__).parent / '_restart_train.py')!r}\n" + _WORKER
    )
    run_dir = tmp_path / "run"
    command = [*warm_launch(str(run_dir)), "--", str(script), "--steps", "6", "--every", "3"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = [json.loads((run_dir / f"facts-{rank}.json").read_text()) for rank in (0, 1)]
    for rank, fact in enumerate(facts):
        assert fact["torch"] and "goodput.warm.template" in fact["cmdline"], fact
        assert fact["ppid"] == facts[0]["ppid"]  # adopted by the agent, not the template's
        with open(run_dir / "ledger" / f"attempt-0000.rank-{rank:05d}.jsonl") as f:
            head = json.loads(f.readline())
        assert head["event"] == "attempt_start"
        # the template's imports (torch, goodput, torch._dynamo: seconds) came before the fork
        assert head["process_start"] < fact["started"] - 0.2, (head, fact)
