"""Node scenarios (``--nnodes 2``): every process of one node of a two-node job SIGKILLed at once, as when the
machine loses power. The job is two ``goodput launch`` agents on this machine meeting through torchrun's c10d
rendezvous on 127.0.0.1; the first one started hosts the rendezvous store.

* ``node``: the lost node is not the store's host. The rendezvous survives: the surviving agent restarts its
  workers and waits (up to ``--rdzv-timeout``) for the node to come back; the lost node's command is run again,
  as a scheduler would on a replacement machine, and the job goes on and completes.
* ``node-store``: the lost node hosts the rendezvous store. The survivor cannot meet anyone again: it stops
  within ``--rdzv-timeout`` with the requeue exit code (75) and one line; both commands again resume.

Either way every sample is trained once and the run ends identical to the uninterrupted one: the relaunch
resumes from the newest checkpoint (the drilled script's durable tier, or its memory tier's peer replica).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import time

from goodput._ports import free_port
from goodput.drill.process import durable_before, last_attempt, recorded, restored_steps, said, signal_step
from goodput.drill.runs import LaunchSpec, finish, outcome_text, processes_of, result, start_launch
from goodput.drill.scenario import DrillContext, Scenario, ScenarioResult, register
from goodput.job.codes import EXIT_PREEMPTED
from goodput.job.signals import descendants

__all__ = [
    "NODE",
    "NODE_STORE",
    "RDZV_TIMEOUT",
    "TwoNodeJob",
    "free_port",
    "lose_node",
    "restored_steps",
    "until_step",
]

RDZV_TIMEOUT = 20  # the drill's --rdzv-timeout, in seconds: how long a survivor may wait for the lost node
_STOP_SLACK = 15.0  # seconds past it for the survivor to end its workers and exit
_WINDOW = 5  # seconds every rank pauses at the step the node is lost at
_LOST_LINE = "the rendezvous lost"  # in goodput launch's line when it stops for a lost node


@dataclasses.dataclass
class TwoNodeJob:
    """A two-node job: one launch per node, node 0 first (it hosts the rendezvous store).

    Attributes:
        context: the drill's; each node runs ``nproc`` ranks.
        run_dir: the run folder both nodes share; node N's output goes to ``node-N.log`` there.
        endpoint: the rendezvous, ``127.0.0.1:PORT``.
        rdzv_timeout: each node's ``--rdzv-timeout``, in seconds.
        procs: the launches of nodes 0 and 1.
        started: when the job started (``time.monotonic()``).
    """

    context: DrillContext
    run_dir: str
    endpoint: str
    rdzv_timeout: int = RDZV_TIMEOUT
    procs: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)
    started: float = 0.0

    def spec(self, node: int, faults: str = "") -> LaunchSpec:
        """Node ``node``'s ``goodput launch``."""
        flags = ("--nnodes", "2", "--rdzv-endpoint", self.endpoint, "--rdzv-id", "goodput-drill",
                 "--rdzv-timeout", f"{self.rdzv_timeout}s")  # fmt: skip
        return LaunchSpec(faults=faults, restarts=3, flags=flags, nodes=2, log=f"node-{node}.log")

    def start(self, node: int, faults: str = "") -> subprocess.Popen[bytes]:
        """Start node ``node``'s launch (again)."""
        return start_launch(self.context, self.run_dir, self.spec(node, faults))

    def start_both(self, faults: str = "") -> bool:
        """Start node 0, and node 1 once node 0's store listens; False if node 0 ended first."""
        self.started = time.monotonic()
        self.procs = [self.start(0, faults)]
        while not _listening(self.endpoint):
            if self.procs[0].poll() is not None:
                return False
            time.sleep(0.05)  # polling the port, not a synchronisation by time
        self.procs.append(self.start(1, faults))
        return True


def _listening(endpoint: str) -> bool:
    host, port = endpoint.rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


def until_step(job: TwoNodeJob, step: int, *, durable: bool = True) -> bool:
    """Wait until a rank of this launch recorded ``step`` and (``durable``) a checkpoint before it is durable;
    False when a node's launch ended first."""
    before = last_attempt(job.run_dir)
    if not job.start_both(f"slow@step={step},seconds={_WINDOW}"):
        return False
    while all(proc.poll() is None for proc in job.procs):
        if recorded(job.run_dir, step, after_attempt=before) and (
            not durable or durable_before(job.run_dir, step)
        ):
            return True
        time.sleep(0.05)  # polling for the step, not a synchronisation by time
    return False


def lose_node(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a node's launch and every process under it at once: frozen first, so none restarts another."""
    frozen: list[int] = []
    for pid in [proc.pid, *descendants(proc.pid), *descendants(proc.pid)]:
        if pid not in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
    for pid in frozen + descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def _node_loss(context: DrillContext, *, store_host: bool) -> ScenarioResult:
    run_dir = os.path.join(context.work_dir, "run")
    job = TwoNodeJob(context, run_dir, f"127.0.0.1:{free_port()}")
    lost, survivor = (0, 1) if store_host else (1, 0)
    step = signal_step(context)
    name = "node-store" if store_host else "node"
    context.say(f"{name}: SIGKILL of every process of node {lost} at step {step}")
    problems: list[str] = []
    if not until_step(job, step):
        problems.append(f"the job ended before step {step}, where node {lost} was to be lost")
    lose_node(job.procs[lost])
    killed = time.monotonic()
    if store_host:
        first = finish(job.procs[survivor], job.started)
        waited = time.monotonic() - killed
        seen = f"node {survivor} {outcome_text(first.status)} {waited:.0f}s later"
        problems += _stopped_in_time(run_dir, survivor, first.status, waited)
        context.say(f"{name}: both nodes' commands again, to the end")
        job.start_both()
        ends = [finish(proc, job.started) for proc in job.procs]
        seconds = first.seconds + max(end.seconds for end in ends)
    else:
        context.say(f"{name}: node {lost}'s command again (a replacement machine)")
        job.procs[lost] = job.start(lost)
        ends = [finish(proc, job.started) for proc in job.procs]
        seconds = max(end.seconds for end in ends)
        seen = f"node {survivor} went on, " + outcome_text(ends[survivor].status)
    if not restored_steps(run_dir):
        problems.append("the relaunch restored no checkpoint: it trained from step 0 again")
    if left := processes_of(run_dir):
        problems.append(f"{len(left)} process(es) of the job left after it ended")
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    status = next((end.status for end in ends if end.status != 0), 0)
    injected = (
        f"SIGKILL of node {lost} ({'the' if store_host else 'not the'} store host) at step {step}: {seen}"
    )
    return result(context, run_dir, injected=injected, status=status, seconds=seconds, problems=problems)


def _stopped_in_time(run_dir: str, node: int, status: int, waited: float) -> list[str]:
    """The survivor's checks: exit 75 within the rendezvous timeout, and one line saying why."""
    found = []
    if status != EXIT_PREEMPTED:
        found.append(f"node {node} {outcome_text(status)}, expected exit {EXIT_PREEMPTED}")
    if waited > RDZV_TIMEOUT + _STOP_SLACK:
        found.append(f"node {node} took {waited:.0f}s to stop, past the {RDZV_TIMEOUT}s rendezvous timeout")
    if said(run_dir, _LOST_LINE, log=f"node-{node}.log") != 1:
        found.append(f"node {node}'s goodput launch did not say in one line that the rendezvous lost a node")
    return found


def _node(context: DrillContext) -> ScenarioResult:
    return _node_loss(context, store_host=False)


def _node_store(context: DrillContext) -> ScenarioResult:
    return _node_loss(context, store_host=True)


NODE = register(
    Scenario(
        name="node",
        injects="SIGKILL of every process of the node that does not host the rendezvous store, then its "
        "command again",
        outcome="the surviving node restarts its workers and waits for it; the job goes on and completes; every "
        "sample once; final state identical",
        run=_node,
        nnodes=2,
        runs=2,
    )
)

NODE_STORE = register(
    Scenario(
        name="node-store",
        injects="SIGKILL of every process of the node that hosts the rendezvous store, then both commands again",
        outcome=f"the surviving node stops within --rdzv-timeout with exit {EXIT_PREEMPTED} and one line; the "
        "relaunch resumes and completes; every sample once; final state identical",
        run=_node_store,
        nnodes=2,
        runs=2,
    )
)
