"""The warm-restart agent behind ``goodput launch --restart warm``: replace only the failed worker.

torchrun's elastic agent (``LocalElasticAgent._invoke_run``) answers any worker's failure with
``_restart_workers``: it stops every worker, re-rendezvouses and starts a whole new group, so each restart
pays for new Python processes, ``import torch``, model construction and a checkpoint restore on every rank.
This agent keeps torch.distributed.elastic's parts and changes that one decision:

* workers and hot spares are forked from the node's template, which imported torch and the script's imports
  once before the first workers (``goodput.warm.forked``), else started with elastic's ``start_processes`` (one
  process context per slot), and all coordinate through a c10d ``TCPStore`` the agent hosts for the job's
  whole life (the keys are in ``goodput.warm.protocol``);
* on a worker's failure (non-zero exit, signal, or the hang watchdog's exit) the agent hands the dead rank to
  a spare that has already imported torch and the script's imports, publishes the next generation, and
  starts a new spare in the background; the survivors, whose collectives failed, leave the failed step in
  their own process, form the new generation's group and recover live from a surviving replica;
* when the warm path cannot recover (a failure during a warm restart, the group not recovered within the
  re-form timeout, a worker that already finished), it falls back to a cold restart of the whole group, like
  torchrun's, from the newest checkpoint; unless the job is complete (``goodput.warm.ending``).

Every decision is appended to ``RUN_DIR/warm/agent.jsonl`` (one JSON object a line), and each worker's ledger
records the restart's parts as seen by that rank.

Several nodes: each node runs an agent (``--nnodes N --rdzv-endpoint HOST:PORT``); the agents meet through
elastic's c10d rendezvous and share its store. Generations are numbered by a store counter; the agent that
sees a failure claims the next generation of the current one (a compare-and-set, so two nodes failing at
once cannot both restart it warm: the loser restarts cold), hands the rank to its own node's spare, and the
other nodes' survivors join without their agent doing anything. A cold restart is announced through the store
(``gen/current``), and every agent restarts its node's workers in it; a shrink or grow renumbers every node's
ranks (``goodput.warm.resize``). Each agent beats in the store, so that a node lost whole, whose agent cannot
report it, is found by the others (``goodput.warm.nodes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

from goodput._env import WARM_GEN, WARM_ROLE, WARM_SPARE_ID, WARM_STARTED
from goodput.job.folder import write_notice
from goodput.launch.launcher import LaunchConfig
from goodput.launch.output import describe_exit
from goodput.warm.ending import JobEnd, finished_while_pending
from goodput.warm.forked import ForkedProcess, TemplateForks, reap_adopted
from goodput.warm.idle import can_return, make_normal
from goodput.warm.nodes import NodeBeats, first_layout, wait_for_nodes
from goodput.warm.protocol import Assignment, Generation
from goodput.warm.record import claim_folder, record_folder, remove_folder
from goodput.warm.resize import Resizer
from goodput.warm.rounds import Round, next_round, node_counts, rendezvous, stop_keep_alive
from goodput.warm.start import WarmConfig, check_warm, kill_group, launch_warm, worker_env
from goodput.warm.store import WarmStore, operations

__all__ = ["AGENT_LOG", "WarmAgent", "WarmConfig", "launch_warm"]

AGENT_LOG = os.path.join("warm", "agent.jsonl")
_DURING = "a failure during a warm restart"


@dataclasses.dataclass
class _Slot:
    ctx: Any  # torch.distributed.elastic.multiprocessing.PContext of one process
    pid: int
    spare: int | None = None  # the spare id this process was started as


class WarmAgent:
    """Starts the workers and spares of one node and restarts failed workers warm (else cold)."""

    def __init__(self, launch: LaunchConfig, warm: WarmConfig) -> None:
        import torch.distributed as dist

        check_warm(launch)
        self.launch = launch
        self.warm = warm
        self.nproc = launch.nproc
        self.rdzv: Any = None  # torch's c10d rendezvous handler (several nodes)
        if launch.nnodes == "1":
            self.node_rank, prefix = 0, ""
            base = dist.TCPStore(
                "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
            )
            self.address = f"127.0.0.1:{base.port}"
        else:
            self.rdzv, self.address = rendezvous(launch), str(launch.rdzv_endpoint)
            host, port = self.address.rsplit(":", 1)
            base = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=60))
            prefix = f"goodput-warm/{launch.rdzv_id}/"
        self._base = base  # the connection (and, on one node, the server) lives as long as the agent
        self.prefix = prefix
        self.store = WarmStore(dist.PrefixStore(prefix, base) if prefix else base)
        first = (
            next_round(self.rdzv, self.store) if self.rdzv is not None else Round(rank=0, nodes=1, first=True)
        )
        self.joiner = not first.first  # a node taken into a running job (it grows the job with its spares)
        self.nnodes = first.nodes
        self.reserved = self.nproc * node_counts(launch)[1]
        joined = 0 if first.first else self.store.join_node()  # a new node id, past MAX's
        self.node_rank = first.rank if first.first else node_counts(launch)[1] + joined - 1
        self.gen = self.store.current() if self.joiner else 0
        nodes = self.store.generation(self.gen).nodes if self.joiner else None
        self.set_layout(nodes or first_layout(self.nnodes, self.nproc))
        self.beats = (
            NodeBeats(lambda: WarmStore.connect(self.address, prefix), self.node_rank) if prefix else None
        )
        self.cold_restarts = 0
        self.restarts = 0
        self.workers: dict[int, _Slot] = {}
        self.spares: list[_Slot] = []
        self._idle_spares = can_return()  # spares wait under SCHED_IDLE when they can be put back
        self._next_spare = 0
        self.pending: tuple[int, float] | None = None  # (generation, deadline) of an unconfirmed restart
        self.finished: set[int] = set()  # ranks whose process ended well
        self._failures: dict[int, str] = {}  # rank -> how its last process ended, for the terminal's line
        self._log_path = os.path.join(launch.run_dir, AGENT_LOG) if launch.run_dir else None
        self._started = time.monotonic()
        self._spares_started = warm.first_spare_delay <= 0 or self.joiner
        self.resize = Resizer(self)
        self.forks = TemplateForks(launch, self.record)  # the node's template (goodput.warm.forked)
        self.ending = JobEnd(self)  # a complete job's end while ranks fail or a restart is pending

    def set_layout(self, layout: dict[int, list[int]]) -> None:
        """Take ``layout`` (node -> global ranks) as the current generation's: this node's ranks, the world."""
        self.layout = layout
        self.world_size = sum(len(ranks) for ranks in layout.values())
        self.ranks = layout.get(self.node_rank, [])

    # ---- processes ---------------------------------------------------------------------------------------
    def _start(self, name: str, env: dict[str, str], spare: bool = False) -> _Slot:
        ctx, pid = self.forks.start(name, env, idle=spare and self._idle_spares, policy=self._idle_spares)
        return _Slot(ctx=ctx, pid=pid)

    def start_worker(self, rank: int, started: float | None = None) -> None:
        """Start ``rank``'s process; its attempt begins at ``started`` (wall time; default now)."""
        env = worker_env(
            self,
            RANK=str(rank),
            LOCAL_RANK=str(self.ranks.index(rank)),
            WORLD_SIZE=str(self.world_size),
            LOCAL_WORLD_SIZE=str(len(self.ranks)),
            GROUP_RANK=str(self.node_rank),
            **{WARM_ROLE.name: "worker", WARM_GEN.name: str(self.gen)},
            **{WARM_STARTED.name: f"{started or time.time():.6f}"},
        )
        self.workers[rank] = self._start(f"rank{rank}", env)

    def start_spare(self) -> None:
        """Start one more hot spare (it imports, then waits for a rank)."""
        spare = self._next_spare
        self._next_spare += 1
        env = worker_env(self, **{WARM_ROLE.name: "spare", WARM_SPARE_ID.name: self.spare_id(spare)})
        slot = self._start(f"spare{spare}", env, spare=True)
        slot.spare = spare
        self.spares.append(slot)

    def spare_id(self, spare: int) -> str:
        """The job-wide id of this node's spare number ``spare`` (its keys in the store)."""
        return f"{self.node_rank}-{spare}"

    def fill_spares(self) -> None:
        """Replace dead spares and start the missing ones, once spares are due."""
        if not self._spares_due():
            return
        alive = []
        for slot in self.spares:
            if slot.ctx.wait(0) is None:
                alive.append(slot)
            else:
                self.record("spare_died", spare=slot.spare, pid=slot.pid)
        self.spares = alive
        reap_adopted([slot.pid for slot in [*self.workers.values(), *self.spares]] + [self.forks.pid() or 0])
        wanted = self.resize.wanted_spares()
        if len(self.spares) >= wanted or not self.forks.settled(self._template_env, self._idle_spares):
            return  # none to make, or the template still imports: its forks will be ready sooner
        while len(self.spares) < wanted:
            self.start_spare()

    def _template_env(self) -> dict[str, str]:  # the template's, made with a spare's environment
        return worker_env(self, **{WARM_ROLE.name: "spare"})

    def _spares_due(self) -> bool:
        """Whether to start spares yet: once every worker of this node has finished a step (``stepped/<rank>``),
        or after ``first_spare_delay`` seconds at most (a spare's start would compete with theirs for the CPU)."""
        if self._spares_started:
            return True
        if time.monotonic() - self._started >= self.warm.first_spare_delay or self.store.all_stepped(
            self.ranks
        ):
            self._spares_started = True
        return self._spares_started

    def publish(self, kind: str, **fields: Any) -> None:
        """Publish the current generation, its kind and facts (``protocol.Generation``), as the one now
        running."""
        self.store.publish(Generation(gen=self.gen, kind=kind, **fields))

    # ---- the loop ----------------------------------------------------------------------------------------
    def run(self) -> int:
        """Run the job to its end; returns its exit status."""

        if self.node_rank == 0 and not self.joiner:
            self.publish("cold", failed=[], nodes=self.layout)
        claim_folder(record_folder(self.address, self.prefix))
        status = 1
        try:
            started = time.time()
            # the first workers are forked from the template too: one import a node, none beside the training
            if self.ranks:
                self.forks.first(self._template_env, self.warm.reform_timeout)
            for rank in self.ranks:
                self.start_worker(rank, started)
            self.fill_spares()
            status = self._monitor()
        finally:
            self.stop(list(self.workers.values()) + self.spares)
            self.forks.close()
            remove_folder(record_folder(self.address, self.prefix))
            if status == 0 and self.prefix:  # beating on: a node still ending its own would call it lost
                wait_for_nodes(
                    self.store, self.resize.nodes_in_job, lambda: self.resize.admit_waiting(now=True)
                )
            if self.beats is not None:
                self.beats.stop()
            stop_keep_alive(self.rdzv)
        return status

    def _monitor(self) -> int:
        # The crash-loop and fatal-error verdicts, and preemption, are the launcher's (goodput.launch.supervise),
        # which ends this agent with its workers; this loop only restarts failed workers.
        while True:
            time.sleep(self.launch.monitor_interval)
            self.resize.follow_current()
            failed = self.poll_workers()
            self._confirm_recovered()  # a restart that recovered is done, before a rank's end is judged
            lost = self.resize.lost_ranks()  # of nodes lost whole: no agent of theirs reports them
            if (ended := self.ending.check(failed)) is not None:  # complete: nothing left to restart
                if ended:
                    return 0
                continue
            if not failed and not lost:
                if self._done():
                    return 0
                self._check_pending()
                self.fill_spares()
                self.resize.maybe_grow()
                continue
            detected = time.time()
            if self.restarts >= self.launch.max_restarts:
                self.record("give_up", failed=failed, restarts=self.restarts)
                stops = f"no restarts left (--max-restarts {self.launch.max_restarts}): the job stops"
                self.notice(sorted(failed), stops)
                return 1
            reason = self._cold_reason()
            if reason in (None, _DURING) and self.resize.answer(
                set(failed) | set(lost), detected, during=bool(reason), node_lost=bool(lost)
            ):
                self.restarts += 1
                continue
            if lost:  # no shrink: no spare of this node may take another node's ranks
                self.resize.told(lost)  # said once; nothing restarts for it
                self.record("node_lost", ranks=lost, reason=reason)
                self.notice([], f"ranks {lost} lost with their node; they cannot shrink away ({reason})")
                if not failed:
                    continue
            self.restarts += 1
            if reason is None:
                self._warm_restart(sorted(failed), detected)
            else:
                self._cold_restart(sorted(failed), detected, reason)

    def _done(self) -> bool:
        """Whether this node's part of the job is over: its ranks finished (a node that holds no rank any
        more, after a shrink, waits for a spare's grow until another node says the job is done)."""
        if not self.ranks:
            return self.store.any_node_done()
        return len(self.finished) == len(self.ranks) or self.resize.finished_before_grow()

    def poll_workers(self) -> dict[int, int]:
        """The ranks that failed since the last poll, with their exit codes (ranks that finished are noted)."""
        failed: dict[int, int] = {}
        for rank, slot in self.workers.items():
            if rank in self.finished:
                continue
            result = slot.ctx.wait(0)
            if result is None:
                continue
            if result.is_failed():
                failure = next(iter(result.failures.values()))
                failed[rank] = failure.exitcode
                self._failures[rank] = describe_exit(failure.exitcode, failure.error_file)
                # Its children (forked data-loader workers) hold copies of its sockets: until they go, the
                # survivors' collectives see no closed connection (the workers notice a dead parent only
                # every 5 s). The worker leads its own session, so its process group is its children.
                kill_group(slot.pid)
            else:
                self.finished.add(rank)
        return failed

    def _cold_reason(self) -> str | None:
        # A warm restart that recovered since the last poll is done: a failure right after it (a rank that
        # fails at the same step every time) is a new failure, to restart warm again, not one during it.
        self._confirm_recovered()
        if self.pending is not None or self._unrecovered():
            return _DURING
        if self.finished:
            return "a worker had already finished"
        return None

    def _confirm_recovered(self) -> bool:
        """Whether the pending warm restart (if any) has recovered on every rank; it is then done."""
        if self.pending is None:
            return False
        gen = self.pending[0]
        if self.store.recovered_count(gen) < self.world_size:
            return False
        self.record("warm_restart_done", gen=gen, store_ops=operations())
        self.pending = None
        self.resize.newcomers = set()  # a grow that recovered holds no newcomer: its ranks end as any other
        return True

    def _check_pending(self) -> None:
        if self.pending is None or self._confirm_recovered():
            return
        reason = finished_while_pending(self)  # a rank that ended well never joins: cold at once
        if reason is None and time.monotonic() > self.pending[1]:
            reason = f"warm restart not recovered within {self.warm.reform_timeout}s"
        if reason is not None:
            self.restarts += 1
            self._cold_restart([], time.time(), reason)

    # ---- restarts ----------------------------------------------------------------------------------------
    def _unrecovered(self) -> bool:
        """Whether the current generation was formed by a warm restart that has not recovered yet."""
        if self.gen == 0:
            return False
        live = self.store.generation(self.gen).live
        return live and self.store.recovered_count(self.gen) < self.world_size

    def claim_next(self) -> bool:
        """Claim the generation after the current one; whether this agent won it (``gen`` is then the new one).
        A compare-and-set, so two nodes failing at once cannot both restart the same generation."""
        old, new = self.gen, self.store.new_generation()
        if not self.store.end_generation(old, new):
            return False
        self.gen = new
        return True

    def _warm_restart(self, failed: list[int], detected: float) -> None:
        """Hand each failed rank to a spare (or a fresh process) and let the survivors join the next group."""
        old = self.gen
        if not self.claim_next():  # another node's agent restarted generation `old` first
            self._cold_restart(failed, detected, "failures on two nodes at once")
            return
        new = self.gen
        handed = [self.hand_over(rank) for rank in failed]
        handover = time.time()
        self.publish("warm", failed=failed, detected_wall=detected, from_gen=old, handover_wall=handover)
        self.pending = (new, time.monotonic() + self.warm.reform_timeout)
        self.record(
            "warm_restart",
            gen=new,
            failed=failed,
            detected_wall=detected,
            handed=handed,
            handover_seconds=round(handover - detected, 6),
            store_ops=operations(),
        )
        to = ", ".join(f"spare {h['spare']}" if h["spare"] is not None else "a new process" for h in handed)
        self.notice(failed, f"warm hand-over to {to} (generation {new})")
        self.fill_spares()

    def hand_over(self, rank: int) -> dict[str, Any]:
        """Give ``rank`` to a spare (or a new process when none is alive); what the agent's log records."""
        spare = self._take_spare()
        if spare is None:
            self.start_worker(rank)
            return {"rank": rank, "spare": None, "pid": self.workers[rank].pid}
        assign = Assignment(
            rank=rank,
            local_rank=self.ranks.index(rank),
            world_size=self.world_size,
            local_world_size=len(self.ranks),
            group_rank=self.node_rank,
            gen=self.gen,
            restart_count=self.cold_restarts,
        )
        assert spare.spare is not None  # taken from the spares
        spare_id = self.spare_id(spare.spare)
        ready = self.store.spare_ready(spare_id)  # False: importing
        if self._idle_spares:
            make_normal(spare.pid)
        assigned = self.store.assign_spare(spare_id, assign)
        assert assigned, f"spare {spare_id} was assigned twice"  # each spare is taken off the list once
        self.workers[rank] = spare
        forked = isinstance(spare.ctx, ForkedProcess)
        return {"rank": rank, "spare": spare.spare, "pid": spare.pid, "ready": ready, "forked": forked}

    def _take_spare(self) -> _Slot | None:
        if not self.spares and self.forks.finish(self.warm.reform_timeout):  # its first spares were due
            self.start_spare()
        while self.spares:
            slot = self.spares.pop(0)
            if slot.ctx.wait(0) is None:
                return slot
            self.record("spare_died", spare=slot.spare, pid=slot.pid)
        return None

    def _cold_restart(self, failed: list[int], detected: float, reason: str) -> None:
        """Stop every worker and start the whole group anew from the newest checkpoint (torchrun's restart)."""
        self.stop(list(self.workers.values()))
        self.workers.clear()
        self.finished.clear()
        self.pending = None
        self.set_layout(self.resize.cold_layout())  # a shrunk job restarts whole, on the nodes it still has
        self.gen = self.store.new_generation()
        self.cold_restarts += 1
        self.publish("cold", failed=failed, detected_wall=detected, reason=reason, nodes=self.layout)
        self.record(
            "cold_restart", gen=self.gen, failed=failed, reason=reason, detected_wall=detected, store_ops=operations(),
        )  # fmt: skip
        self.notice(failed, f"cold restart of every rank ({reason})")
        for rank in self.ranks:
            self.start_worker(rank)
        self.fill_spares()

    def stop(self, slots: list[_Slot]) -> None:
        for slot in slots:
            with contextlib.suppress(Exception):
                slot.ctx.close(death_sig=signal.SIGKILL, timeout=5)
            kill_group(slot.pid)

    def notice(self, failed: Sequence[int], done: str) -> None:
        """One line for the terminal: what failed and what was done (see ``goodput.launch.output``)."""
        what = "; ".join(f"rank {rank} {self._failures.get(rank, 'failed')}" for rank in failed)
        write_notice(f"{what}; {done}" if what else done)

    def record(self, event: str, **fields: Any) -> None:
        """Append ``event`` to the agent's log (``RUN_DIR/warm/agent.jsonl``)."""
        if self._log_path is None:
            return
        os.makedirs(os.path.dirname(self._log_path), exist_ok=True)
        with open(self._log_path, "a") as f:
            f.write(json.dumps({"event": event, "wall": time.time(), **fields}) + "\n")
