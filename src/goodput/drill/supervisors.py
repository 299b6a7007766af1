"""Scenarios that kill goodput's own processes: ``agent`` (the warm-restart agent) and ``launcher``
(``goodput launch`` itself), each SIGKILLed mid-run and the same command run again.

What they check beyond the resume: nothing of the killed job is left: no process (``GOODPUT_RUN_DIR`` in its
environment), and after the relaunch no RAM folder of the killed launch (``/dev/shm/goodput-warm-*``, which
only the next launch can sweep) nor its temporary folder (:mod:`goodput.launch.scratch`). File locks
(``fcntl``) end with the processes that hold them.
"""

from __future__ import annotations

import glob
import os
import signal
import time

from goodput.drill.process import launch_until_step, restored_steps, signal_step
from goodput.drill.runs import LaunchSpec, finish, outcome_text, processes_of, result, run_launch
from goodput.drill.scenario import DrillContext, Scenario, ScenarioResult, register
from goodput.job.folder import LAUNCHES_DIR
from goodput.launch.scratch import job_temp_path
from goodput.warm.record import record_folder

__all__ = ["AGENT", "LAUNCHER", "agent_pid", "left_after", "ram_folders"]

_GONE_WITHIN = 5.0  # seconds after a kill by which no process of the job may be left


def agent_pid(run_dir: str) -> int | None:
    """The warm agent of the job in ``run_dir`` (``python -m goodput.warm``), if it runs."""
    for pid in processes_of(run_dir):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"goodput.warm" in argv[:4]:
            return pid
    return None


def left_after(run_dir: str) -> list[int]:
    """The job's processes still alive once they have had ``_GONE_WITHIN`` seconds to end (polled)."""
    deadline = time.monotonic() + _GONE_WITHIN
    while (left := processes_of(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel's parent-death signals land within milliseconds; polled
    for pid in left:  # leave the machine clean: the drill reports them
        os.kill(pid, signal.SIGKILL)
    return left


def ram_folders(run_dir: str) -> list[str]:
    """The warm record folders and the temporary folders (:mod:`goodput.launch.scratch`) of every launch of the
    run that still exist."""
    launches = [os.path.basename(p) for p in glob.glob(os.path.join(run_dir, LAUNCHES_DIR, "*"))]
    folders = [record_folder("", "", launch=launch) for launch in launches]
    folders += [job_temp_path(launch) for launch in launches]
    return [folder for folder in folders if os.path.exists(folder)]


def _kill_and_relaunch(context: DrillContext, victim: str) -> ScenarioResult:
    run_dir = os.path.join(context.work_dir, "run")
    spec = LaunchSpec(restarts=3, warm=True)
    step = signal_step(context)
    context.say(f"{victim}: SIGKILL of the {victim} at step {step}, under --restart warm")
    proc, started, reached = launch_until_step(context, run_dir, spec, step, durable=True)
    problems = [] if reached else [f"the run ended before step {step}, where the {victim} was to be killed"]
    pid = (proc.pid if victim == "launcher" else agent_pid(run_dir)) if reached else None
    if reached and pid is None:
        problems.append("the warm agent was not found")
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    if victim == "launcher" and pid is not None:
        proc.wait()  # its job is what must end now
        left = left_after(run_dir)
        first = finish(proc, started)
    else:
        first = finish(proc, started)
        left = left_after(run_dir)
    if left:
        problems.append(
            f"{len(left)} process(es) of the job outlived the killed {victim} by {_GONE_WITHIN:.0f}s"
        )
    context.say(f"{victim}: the same command again, to the end")
    done = run_launch(context, run_dir, spec)
    if left := processes_of(run_dir):
        problems.append(f"{len(left)} process(es) left after the relaunch ended")
    if folders := ram_folders(run_dir):
        problems.append(f"RAM or temporary folders left: {', '.join(folders)}")
    if reached and not restored_steps(run_dir):
        problems.append("the relaunch restored no checkpoint: it trained from step 0 again")
    injected = f"SIGKILL of the {victim} at step {step}: first launch {outcome_text(first.status)}"
    return result(
        context, run_dir, injected=injected, status=done.status, seconds=first.seconds + done.seconds,
        problems=problems,
    )  # fmt: skip


def _agent(context: DrillContext) -> ScenarioResult:
    return _kill_and_relaunch(context, "agent")


def _launcher(context: DrillContext) -> ScenarioResult:
    return _kill_and_relaunch(context, "launcher")


AGENT = register(
    Scenario(
        name="agent",
        injects="SIGKILL of the warm-restart agent (goodput launch --restart warm) mid-run",
        outcome="its workers and hot spare end with it, the launch stops; the same command again resumes and "
        "completes; every sample once; final state identical",
        run=_agent,
        runs=2,
    )
)

LAUNCHER = register(
    Scenario(
        name="launcher",
        injects="SIGKILL of goodput launch (--restart warm) mid-run, then the same command again",
        outcome=f"no process of the job outlives it by {_GONE_WITHIN:.0f}s; the relaunch resumes and completes, "
        "and sweeps the killed launch's RAM folder; every sample once; final state identical",
        run=_launcher,
        runs=2,
    )
)
