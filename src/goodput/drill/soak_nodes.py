"""``goodput drill --soak DURATION --nnodes 2``: the soak's job as two node launches on this machine, and the
fault kind ``node``: a whole node lost, then its command run again.

The job is two ``goodput launch --restart warm --nnodes 2`` commands meeting through torch's c10d rendezvous on
127.0.0.1, as the drill's node scenarios run them (node 0, started first, hosts the rendezvous store); each runs
``--nproc`` ranks and one hot spare, and the job shrinks (``--shrink-after``) down to one node's ranks at least
(``--min-world``). The in-process kinds hit a rank of either node (one fault plan, given to both launches). A
``node`` fault SIGKILLs node 1's launcher, agent, ranks and spares at once, as a machine that loses power: the
other node's agent finds its heartbeat silent and shrinks the job onto its own ranks in place; once it has, the
soak runs node 1's command again, as a scheduler on a replacement machine, and the job grows back. Node 0 is
never the one lost: the rendezvous store goes with it, and the other node stops for a relaunch of both
(docs/warm-restarts.md, Several nodes), a cold restart the soak leaves out.

A shrink sums each step's gradient over fewer ranks, so a soak whose world changed cannot end bit for bit as an
uninterrupted run: its lineage is compared with one step by step in its global batches (every step the same
samples, whatever the split over ranks), and its final state only when no node was lost.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

from goodput._ports import free_port
from goodput.drill.node import _listening, lose_node
from goodput.drill.runs import LaunchSpec, start_launch
from goodput.drill.scenario import DrillContext, Reference
from goodput.drill.soak import SAMPLES_FILE, _latest_step, _report_progress, _Watch, _watching
from goodput.drill.soak_plan import NODE_KINDS, Checks, SoakFault, SoakPlan, draw_schedule, fault_plan
from goodput.drill.soak_report import Outcome, compared_until, judge_run
from goodput.job.codes import EXIT_PREEMPTED
from goodput.launch.rendezvous import NEVER_GATHERED, STORE_HOST_LOST
from goodput.verify.records import RunRecords, read_records
from goodput.verify.shrink import effective

__all__ = [
    "LOST_NODE",
    "NODE_WINDOW_SECONDS",
    "demo_global_batch",
    "draw_two_nodes",
    "global_batch_problems",
    "node_flags",
    "run_two_nodes",
    "worlds_against",
]

LOST_NODE = 1  # the node a ``node`` fault loses: not the rendezvous store's host
SHRINK_AFTER = 10.0  # seconds a rank's failure waits for its node's spare before the job shrinks
COLLECTIVE_TIMEOUT = 5.0  # below the built-in script's hang timeout (10 s): a hung rank's peers fail first
RDZV_TIMEOUT = 60  # seconds a node's rendezvous waits for the other
# a lost node's place in the rendezvous expires after 3 missed 1 s keep-alives, so its replacement is admitted
RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
# seconds of training after a node's loss that hold no other fault: the job trains on one node's ranks until the
# node's command, run again, has joined and grown it back (a rank of the lost node does not exist meanwhile)
NODE_WINDOW_SECONDS = 60.0
_AGAIN_WITHIN = 60.0  # seconds after a node's loss its command runs again, shrunk or not
_POLL = 0.2  # seconds between the soak's looks at the job


def draw_two_nodes(
    *, seed: int, mtbf: float, seconds: float, step_seconds: float, steps: int, first_step: int, nproc: int,
    kinds: Sequence[str] = NODE_KINDS, checks: Checks | None = None, rollbacks: tuple[int, int] | None = None,
) -> tuple[SoakFault, ...]:  # fmt: skip
    """The schedule of a two-node soak: :func:`draw_schedule` over both nodes' ranks, less the faults drawn
    into the :data:`NODE_WINDOW_SECONDS` after a ``node`` fault (the next ``node`` fault included)."""
    drawn = draw_schedule(
        seed=seed, mtbf=mtbf, seconds=seconds, step_seconds=step_seconds, steps=steps, first_step=first_step,
        world=2 * nproc, kinds=kinds, checks=checks, rollbacks=rollbacks,
    )  # fmt: skip
    window = math.ceil(NODE_WINDOW_SECONDS / step_seconds)
    kept: list[SoakFault] = []
    for fault in drawn:
        lost = [f.step for f in kept if f.kind == "node"]
        if not lost or fault.step > lost[-1] + window:
            kept.append(fault)
    return tuple(kept)


def demo_global_batch(nproc: int) -> int:
    """The built-in script's global batch on two nodes of ``nproc`` ranks: divisible by every world the job may
    train on (one node's ranks to both nodes'), and about 8 samples per rank on both nodes."""
    every = math.lcm(*range(nproc, 2 * nproc + 1))
    return every * math.ceil(16 * nproc / every)


def node_flags(endpoint: str, nproc: int) -> tuple[str, ...]:
    """Each node's ``goodput launch`` flags besides the soak's usual ones."""
    return (
        "--nnodes", "2", "--rdzv-endpoint", endpoint, "--rdzv-id", "goodput-soak", "--rdzv-timeout",
        f"{RDZV_TIMEOUT}s", "--shrink-after", f"{SHRINK_AFTER:g}", "--min-world", str(nproc),
        "--collective-timeout", f"{COLLECTIVE_TIMEOUT:g}",
    )  # fmt: skip


def global_batch_problems(records: RunRecords) -> list[str]:
    """Why the final lineage did not train the same global batch at every step (empty: it did)."""
    sizes: dict[int, int] = {}
    for steps in effective(records).steps.values():
        for step, record in steps.items():
            sizes[step] = sizes.get(step, 0) + (record.count or 0)
    usual = max(sizes.values(), default=0)
    other = sorted(step for step, size in sizes.items() if size != usual)
    if not other:
        return []
    return [f"{len(other)} step(s) trained a global batch other than {usual} samples, the first {other[:5]}"]


def worlds_against(reference: RunRecords, records: RunRecords) -> tuple[str, bool]:
    """A lineage whose world changed against the uninterrupted run's: each step's samples over every rank, in
    one line, and whether they are the same."""
    mine, theirs = _global(effective(records)), _global(reference)
    differ = sorted(step for step in theirs.keys() | mine.keys() if mine.get(step) != theirs.get(step))
    worlds = sorted(
        {r.world for steps in effective(records).steps.values() for r in steps.values() if r.world}
    )
    if differ:
        return (
            f"the final lineage's global batches differ from the uninterrupted run's at steps {differ[:5]}",
            False,
        )
    return (
        f"the final state: every step's global batch as the uninterrupted run's ({len(theirs)} steps, on "
        f"{' and '.join(map(str, worlds))} ranks); losses and final state not compared (a smaller world sums "
        f"the gradients in another order)",
        True,
    )


def _global(records: RunRecords) -> dict[int, tuple[int, ...]]:
    by_step: dict[int, list[int]] = {}
    for steps in records.steps.values():
        for step, record in steps.items():
            by_step.setdefault(step, []).extend(record.ids or ())
    return {step: tuple(sorted(ids)) for step, ids in by_step.items()}


def run_two_nodes(
    plan: SoakPlan, script: tuple[str, ...], *, nproc: int, work: str, reference: RunRecords | None,
    say: Callable[[str], None],
) -> Outcome:  # fmt: skip
    """Run the soak's job as two node launches with ``plan``'s faults and judge it (:func:`judge_run`, the
    lineage's global batch, and the global batches or the records against ``reference``)."""

    run_dir = os.path.join(work, "soak")
    context = DrillContext(
        script=script, nproc=nproc, nnodes=2, seed=plan.seed, work_dir=work, reference=Reference.empty(), say=say
    )  # fmt: skip
    nodes = _Nodes(
        context, run_dir, f"127.0.0.1:{free_port()}", fault_plan(plan.schedule), len(plan.schedule)
    )
    watch, sampler = _watching(plan, run_dir, script[0])
    try:
        status = _follow(nodes, watch, lambda: sampler.leaked, plan, say)
    finally:
        sampler.stop()
        sampler.save(os.path.join(work, SAMPLES_FILE))
    changed = any(f.kind == "node" for f in plan.schedule) and _world_changed(run_dir)
    outcome = judge_run(
        plan, run_dir, status=status, seconds=time.monotonic() - watch.began, sampler=sampler,
        stopped=watch.violation, reference=None if changed else reference, node_ranks=nproc,
    )  # fmt: skip
    if watch.violation or not os.path.isdir(os.path.join(run_dir, "records")):
        return outcome
    records = read_records(run_dir)
    found = global_batch_problems(records)
    result = outcome.result
    if changed and reference is not None:
        result, same = compared_until(worlds_against, reference, records, outcome.first_skip)
        found += [] if same else [result]
    return dataclasses.replace(outcome, result=result, violations=(*outcome.violations, *found))


def _world_changed(run_dir: str) -> bool:
    try:
        steps = effective(read_records(run_dir)).steps
    except FileNotFoundError:
        return False
    return len({r.world for by_step in steps.values() for r in by_step.values()}) > 1


class _Nodes:
    """The two launches of the job: node 0 first (it hosts the rendezvous store), node 1 once it listens."""

    def __init__(self, context: DrillContext, run_dir: str, endpoint: str, faults: str, count: int) -> None:
        self.context, self.run_dir, self.endpoint = context, run_dir, endpoint
        self.faults, self.restarts = faults, count + 2
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, node: int) -> subprocess.Popen[bytes]:
        spec = LaunchSpec(
            faults=self.faults, restarts=self.restarts, warm=True, nodes=2, log=f"node-{node}.log",
            flags=node_flags(self.endpoint, self.context.nproc), env={"PET_RDZV_CONF": RDZV_CONF},
        )  # fmt: skip
        return start_launch(self.context, self.run_dir, spec)

    def start_both(self) -> None:
        self.procs = [self.start(0)]
        while not _listening(self.endpoint) and self.procs[0].poll() is None:
            time.sleep(0.05)  # polling the port, not a synchronisation by time
        self.procs.append(self.start(1))

    def stop(self) -> None:
        for proc in self.procs:
            for _ in range(2):  # a second signal stops goodput launch at once
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)


def _follow(
    nodes: _Nodes, watch: _Watch, leaked: Callable[[], str], plan: SoakPlan, say: Callable[[str], None]
) -> int:
    """Watch the job to its end: progress lines, each node fault sent once the job trained past its step and
    the lost node's command run again once the job shrank without it (or after :data:`_AGAIN_WITHIN`), the job
    stopped at once on a leak. Returns its exit status: the first launch that did not complete (a lost node's
    launch replaced by its command's run again; not counted when the job ended before that)."""
    nodes.start_both()
    limit = time.monotonic() + 600.0 + 10 * plan.seconds
    # when node 1 was lost, and the shrinks the agents had recorded then; None: not lost, or running again
    lost: tuple[float, int] | None = None
    ended = outlived = False  # whether node 0's command has ended; whether node 1's still ran then
    while any(proc.poll() is None for proc in nodes.procs):
        time.sleep(_POLL)  # polling the job's folder, not a synchronisation by time
        at = f"[{time.monotonic() - watch.began:6.1f}s]"
        if not ended and nodes.procs[0].poll() is not None:
            ended, outlived = True, nodes.procs[LOST_NODE].poll() is None
        _report_progress(nodes.run_dir, watch, plan, say)
        if leaked() or time.monotonic() > limit:
            watch.violation = leaked() or f"the job ran past {limit - watch.began:.0f}s"
            say(f"{at} stopping the job at once: {watch.violation}")
            nodes.stop()
            break
        if lost is not None:
            again = _shrinks(nodes.run_dir) > lost[1] or time.monotonic() - lost[0] > _AGAIN_WITHIN
            if again and nodes.procs[0].poll() is None:  # a job that ended meanwhile needs no replacement
                say(f"{at} node {LOST_NODE}'s command again (a replacement machine)")
                nodes.procs[LOST_NODE] = nodes.start(LOST_NODE)
                lost = None
        elif (
            watch.sent
            and _latest_step(nodes.run_dir, since=0.0) >= watch.sent[0].step
            and _world(nodes.run_dir) == 2 * nodes.context.nproc
        ):
            fault = watch.sent.pop(0)
            lost = (time.monotonic(), _shrinks(nodes.run_dir))
            lose_node(nodes.procs[LOST_NODE])
            say(f"{at} injected: {fault.text()}")
    ran = nodes.procs if lost is None else nodes.procs[:LOST_NODE]
    statuses = [proc.wait() for proc in ran]
    if (
        len(statuses) > LOST_NODE
        and statuses[0] == 0
        and _found_store_gone(nodes.run_dir, statuses[LOST_NODE], outlived=outlived)
    ):
        # the job completed on node 0 before node 1's command, run again, reached its rendezvous, and nothing was
        # lost; a command that waited in the rendezvous while the job ran and was never admitted still counts
        say(
            f"node {LOST_NODE}'s command again found the job's store gone: the job completed before it joined"
        )
        statuses[LOST_NODE] = 0
    return next((s for s in statuses if s != 0), 0)


def _found_store_gone(run_dir: str, status: int, *, outlived: bool) -> bool:
    """Whether node 1's last launch ended because the rendezvous store's host had left (its launcher's last line,
    exit 75), not because its rendezvous timed out or its job failed. Also when it came after that host had left
    (on one machine it then hosts a store of its own, alone) and waited out its first round: that is a timeout,
    but only one that ended after node 0's launch did (``outlived``); one inside the job's store while node 0 still
    ran would be a node never admitted."""
    if status != EXIT_PREEMPTED:
        return False
    try:
        with open(os.path.join(run_dir, f"node-{LOST_NODE}.log"), errors="replace") as f:
            said = [line for line in f if line.startswith("goodput launch: ")]
    except OSError:
        return False
    return bool(said) and (STORE_HOST_LOST in said[-1] or (outlived and NEVER_GATHERED in said[-1]))


def _world(run_dir: str) -> int:
    """The world size of the newest attempt a rank recorded (its records' header); 0: none yet."""
    from goodput.run.records import RECORDS_DIR

    folder = os.path.join(run_dir, RECORDS_DIR)
    names = [n for n in os.listdir(folder) if n.startswith("attempt-")] if os.path.isdir(folder) else []
    if not names:
        return 0
    newest = max(names, key=lambda n: int(n.split(".")[0].split("-")[1]))
    try:
        with open(os.path.join(folder, newest)) as f:
            return int(json.loads(f.readline()).get("world") or 0)
    except (OSError, ValueError):
        return 0


def _shrinks(run_dir: str) -> int:
    """The shrinks the job's agents have recorded (``warm/agent.jsonl``)."""
    try:
        with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
            return sum(1 for line in f if '"event": "shrink"' in line)
    except OSError:
        return 0
