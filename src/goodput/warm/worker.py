"""Warm restarts, the worker's side: survivors keep their process, a hot spare takes the dead rank's place.

Under ``goodput launch --restart warm`` (see ``goodput.warm.agent``) every worker and spare talks to the
agent's TCP store, which outlives every worker; its keys and what each means: ``goodput.warm.protocol``.

Each rank's RNG state after its last completed step is written at every ``step_done`` to a node-local RAM file
(:mod:`goodput.warm.record`), so a replacement on the same node takes over its predecessor's streams exactly.

Live recovery (``kind == "warm"``): every rank of the new group says which step it holds (a survivor: its last
completed step; the replacement: none). The group adopts the highest; the lowest rank holding it broadcasts
``TrainingState``'s live form (model, optimizer, scheduler, scaler, loader position, step) through
:mod:`goodput.checkpoint.transfer` (checksummed, no pickle) into the objects the re-entered training function
built. With DDP every rank contributed its gradients to any step one survivor completed, so at most the failed
step is redone. Every rank then restores its RNG from its record; after a shrink or a grow, from the old rank's
with its new number, as a cold resume on the new world would (:mod:`goodput.warm.streams`). Sharded models
(FSDP/DTensor parameters) hold no full replica, so they fall back to the newest checkpoint.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from goodput._env import (
    WARM_GEN,
    WARM_PG_TIMEOUT,
    WARM_PREFIX,
    WARM_REFORM_TIMEOUT,
    WARM_ROLE,
    WARM_SPARE_ID,
    WARM_STARTED,
    WARM_STORE,
)
from goodput.warm.hangup import Hangup
from goodput.warm.protocol import Complete, Generation
from goodput.warm.record import RecordFiles, record_folder
from goodput.warm.store import WarmStore, operations, operations_since
from goodput.warm.watch import EndWatch, abort_communicators, install_optimizer_guard

__all__ = ["WarmWorker", "warm_enabled"]

_LIVE = "goodput_live"  # the hand-over's entry beside the state: the sender's ledger's live totals


def warm_enabled() -> bool:
    """True in a worker or spare started by the warm-restart agent."""
    return bool(WARM_STORE.get())


@dataclass
class Snapshot:
    """A survivor's state after its last completed step, taken from the objects of the failed generation."""

    step: int
    parts: dict[str, Any] = field(default_factory=dict)


class WarmWorker:
    """This process's place in a warm-restartable job: its store, generation and process group."""

    def __init__(self) -> None:
        self._ops_before = operations()  # a recovery's store operations count from here (a spare's: its life)
        prefix = WARM_PREFIX.get()  # several nodes share the rendezvous's store
        self.store = WarmStore.connect(WARM_STORE.get(), prefix)
        self.pg_timeout = float(WARM_PG_TIMEOUT.get())
        self.reform_timeout = float(WARM_REFORM_TIMEOUT.get())
        self.spare_wait: float | None = None  # seconds this process waited as a spare
        self.began: float | None = None  # a spare's attempt begins when it is handed a rank
        if WARM_ROLE.get() == "spare":
            self._wait_for_rank()
        elif WARM_STARTED.get():  # started by the agent: maybe forked from a template that imported for it
            self.began = float(WARM_STARTED.get())
        self.gen = int(WARM_GEN.get())
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.info: Generation | None = None  # the generation's, once joined
        self._rng_records = RecordFiles(record_folder(WARM_STORE.get(), prefix), self.rank)
        self._stepped = False
        self._sharded_told = False
        self.joined_wall = 0.0
        self._last_loader: Any = None  # the loader's position after step ``_loader_step``
        self._loader_step: int | None = None
        self._failed_wall: float | None = None
        self._pending_rng: Callable[[], object] | None = None  # puts this rank's streams in place, once
        from goodput.checkpoint.rng import RngCapture  # torch: imported by the worker, not by the agent

        self._rng = RngCapture()
        self._backend: str | None = None  # the script's choice, kept for every later generation
        self._ctl: Any = None  # a gloo group of the generation: live recovery's CPU tensors, on any backend
        self._watch: EndWatch | None = None
        self._hangup: Hangup | None = None  # breaks the current gloo generation's connections
        self._left: int | None = None  # the generation this rank last left
        self.step_of: Callable[[], int] | None = None  # the last completed step (Run's), for the records
        self._outputs_hook: Any = None  # the forward hook that records the RNG when a backward begins

    # ---- joining -------------------------------------------------------------------------------------------
    def _wait_for_rank(self) -> None:
        """Block as a hot spare until the agent assigns a rank and generation (then export them)."""
        spare = WARM_SPARE_ID.get()
        self.store.announce_spare(spare, os.getpid())
        start = time.monotonic()
        assign = self.store.wait_for_assignment(spare)
        self.spare_wait = time.monotonic() - start
        self.began = time.time()
        os.environ.update(
            RANK=str(assign.rank),
            LOCAL_RANK=str(assign.local_rank),
            WORLD_SIZE=str(assign.world_size),
            LOCAL_WORLD_SIZE=str(assign.local_world_size),
            GROUP_RANK=str(assign.group_rank),
            TORCHELASTIC_RESTART_COUNT=str(assign.restart_count),
            **{WARM_GEN.name: str(assign.gen), WARM_ROLE.name: "worker"},
        )

    def join(self, backend: str | None = None, *, survivor: bool = False) -> None:
        """Form generation ``self.gen``'s process group (:meth:`_form`); past each generation that ends before it
        forms (a rank failed as it formed), its successor's, this rank taking its place there as a survivor."""
        while not self._form(backend, survivor=survivor):
            self._next_generation(self.reform_timeout)
            survivor = True

    def _form(self, backend: str | None, *, survivor: bool) -> bool:
        """Form generation ``self.gen``'s process group in its own store namespace; False when the generation
        ended before it formed.

        ``backend`` is remembered: the generations a warm restart forms later use the same one. With NCCL,
        ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` defaults to 2 (abort the communicators on an error or a timeout,
        keep the process), so NCCL's watchdog does not end a survivor whose peer died. A ``survivor`` of a
        shrink or grow takes its new rank and world size from the generation's info.
        """
        import torch
        import torch.distributed as dist

        if backend is not None:
            self._backend = backend
        self.info = self.store.generation(self.gen)
        if survivor:
            self._renumber()
        if not self._wait_for_all():
            return False
        backend = self._backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        # before the generation's first group listens: each gloo group formed from here on is the generation's
        self._hangup = Hangup() if backend == "gloo" else None
        dist.init_process_group(
            backend,
            store=self.store.group_store(self.gen),
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=self.pg_timeout),
        )
        self._ctl = dist.new_group(backend="gloo") if backend != "gloo" else None
        on_end = self._hangup if self._hangup is not None else abort_communicators
        self._watch = EndWatch(WARM_STORE.get(), WARM_PREFIX.get(), self.gen, on_end=on_end)
        install_optimizer_guard(self._watch, self._record_before_step)
        self.joined_wall = time.time()
        return True

    def _wait_for_all(self) -> bool:
        """Wait until every rank of the generation has arrived (a cold one's new processes import torch first);
        False when the agent ended it first (a rank failed)."""
        import torch.distributed as dist

        self.store.arrive(self.gen, self.world_size)
        limit = self.reform_timeout if self.live_recovery else max(600.0, self.reform_timeout)
        # One blocking wait, on the key the last rank to arrive sets and the agent sets too when it ends the
        # generation (a rank that dies before it arrives: a shrink): the ranks that did arrive then leave at
        # once, and a waiting rank costs the store a few operations however long the others take.
        formed = self.store.wait_settled(self.gen, limit)
        if formed is None:
            raise dist.DistStoreError(f"goodput: generation {self.gen} did not form within {limit:g}s")
        return formed

    def _renumber(self) -> None:
        """Take this survivor's place in a shrunk or grown generation (the agent's ``ranks``: old -> new)."""
        info = self.info
        if info is None or info.ranks is None:
            return
        assert info.world_size is not None and info.nodes is not None  # a resized generation carries both
        self.rank = info.ranks[self.rank]
        self.world_size = info.world_size
        # this node's ranks after the renumbering (across every node: goodput.warm.nodes)
        local = next(held for held in info.nodes.values() if self.rank in held)
        os.environ.update(
            RANK=str(self.rank),
            LOCAL_RANK=str(local.index(self.rank)),
            WORLD_SIZE=str(self.world_size),
            LOCAL_WORLD_SIZE=str(len(local)),
        )
        self._rng_records = RecordFiles(record_folder(WARM_STORE.get(), WARM_PREFIX.get()), self.rank)

    @property
    def live_recovery(self) -> bool:
        """Whether this generation was formed by a warm restart, a shrink or a grow (recover from the survivors,
        not a checkpoint)."""
        return self.info is not None and self.info.live

    @property
    def resized(self) -> bool:
        """Whether this generation changed the world size (a shrink or a grow)."""
        return self.info is not None and self.info.kind in ("shrink", "grow")

    @property
    def ending(self) -> bool:
        """Whether the agent has ended this generation (a peer failed, or the group grows)."""
        return self._watch is not None and self._watch.ended.is_set()

    def over(self, gen: int) -> bool:
        """Whether generation ``gen`` is over for this rank: the agent ended it, or this rank has left it."""
        return gen != self.gen or self._left == gen or self.ending

    # ---- every step ----------------------------------------------------------------------------------------
    def step_committed(self, step: int, loader: Any) -> None:
        """Record this rank's position after a completed step: the loader's in memory, the RNG in the store."""
        self._keep_position(step, loader)
        self._rng_records.write(step, self._rng.capture())
        if not self._stepped:
            self.store.mark_stepped(self.rank, step)
            self._stepped = True

    def position_restored(self, step: int, loader: Any, *, from_checkpoint: bool) -> None:
        """Record the position just restored as this rank's last completed step's.

        A warm restart before this generation's first completed step hands on the restored step: without this
        it would hand on that step's model with no loader position (a cold generation's new process has none),
        and every rank's new loader would start the data again. After a checkpoint's restore the RNG record of
        the step is written too (the checkpoint put the states back), so the rank's records agree with it.
        """
        self._keep_position(step, loader)
        if from_checkpoint:
            self._rng.reset()
            self._rng_records.write(step, self._rng.capture())

    def closed(self, step: int, total_steps: int | None, committed: list[int]) -> None:
        """This rank closed its run at ``step`` (``committed``: the steps its checkpoints hold committed). At
        the job's last step, committed, the job is complete: say so, so that a peer's failure meanwhile (its
        restart pending, or about to be) ends the job instead of restarting it."""
        if total_steps is not None and step >= total_steps and step in committed:
            self.store.mark_complete(Complete(rank=self.rank, step=step, gen=self.gen))

    def state_registered(self, state: Any) -> None:
        """Tell the agent, once, when this rank's model is sharded (FSDP/DTensor): no survivor would hold a
        replica to go on with, so the job must not shrink (a failure takes today's path instead)."""
        if not self._sharded_told and not state.holds_full_replica():
            self.store.mark_sharded(self.rank)
            self._sharded_told = True

    def _keep_position(self, step: int, loader: Any) -> None:
        # a plain iterable (a list of batches) has no position to hand on
        self._last_loader = loader.state_dict() if hasattr(loader, "state_dict") else None
        self._loader_step = step

    def _record_before_step(self) -> None:
        """Record the RNG again just before an optimizer step, as the step in progress (``Run`` sets
        ``step_of``). Its gradients are all-reduced by then, so a survivor may complete this step even if this
        rank dies before ``step_done``: its replacement then finds this step's record, not the one before."""
        if self.step_of is not None:
            self._rng_records.write(self.step_of() + 1, self._rng.capture())

    def record_at_backward(self, model: Any) -> None:
        """Record the RNG, as the step in progress, each time a backward pass reaches ``model``'s outputs
        (None: stop).

        That is before any of the step's gradients leave this rank: a rank killed between the gradients'
        all-reduce and its optimizer step (its peers may complete the step and the group adopt it) has then
        left the step's record all the same. The record before the optimizer step stays, for a loss whose
        backward never reaches the model's outputs (or outputs the hook cannot see inside).
        """
        import torch

        if self._outputs_hook is not None:
            self._outputs_hook.remove()
            self._outputs_hook = None
        if isinstance(model, torch.nn.Module):
            self._outputs_hook = model.register_forward_hook(self._hook_outputs)

    def _hook_outputs(self, module: Any, args: Any, output: Any) -> None:
        import torch
        from torch.utils._pytree import tree_flatten

        if not torch.is_grad_enabled():
            return
        fired = [False]  # the first output the backward reaches records; the others of this forward need not

        def at_backward(grad: Any) -> None:
            if not fired[0]:
                fired[0] = True
                self._record_before_step()

        for leaf in tree_flatten(output)[0]:
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                leaf.register_hook(at_backward)

    # ---- leaving a failed generation -----------------------------------------------------------------------
    def snapshot(self, step: int, state: Any, live: dict[str, float]) -> Snapshot | None:
        """The survivor's state after its last completed step, or None if it holds none worth handing on;
        with ``live``, its ledger's live totals, which a recovery hands on beside the state."""
        if state is None or step <= 0 or not state.holds_full_replica():
            return None
        if self._loader_step != step:  # no loader position of this step: the model alone would repeat data
            return None
        parts = state.live_state_dict(loader=self._last_loader)
        return Snapshot(step=step, parts={**parts, _LIVE: json.dumps(live)})

    def leave(self, at_least: float = 0.0) -> int:
        """Tear down the failed group and wait for the agent to name the next generation; join it (its number).

        ``at_least``: seconds to wait however short the re-form timeout is: a hung peer is ended by its own
        watchdog only after the script's hang timeout; a survivor that gave up sooner would make it a cold restart.

        Raises:
            TimeoutError: no next generation within the re-form timeout (the agent then restarts cold).
        """
        import torch.distributed as dist

        self._failed_wall = time.time()
        self._left = self.gen
        self._ops_before = operations()
        if self._hangup is not None:  # a peer blocked reading from this rank fails now, not at its timeout
            self._hangup()
            self._hangup = None
        self.stop_watch()
        if dist.is_initialized():
            if "nccl" in str(dist.get_backend()):
                # A clean shutdown of an NCCL communicator waits for its peers, and one is dead: abort every
                # communicator instead (ncclCommAbort, through PyTorch's abort), which also forgets the groups.
                dist.distributed_c10d._abort_process_group()
            else:
                dist.destroy_process_group()
        self._ctl = None
        limit = max(self.reform_timeout, at_least)
        self._next_generation(limit)
        self.join(survivor=True)
        return self.gen

    def _next_generation(self, limit: float) -> None:
        nxt = self.store.wait_for_successor(self.gen, limit)
        if nxt is None:
            raise TimeoutError(f"no warm restart of generation {self.gen} within {limit:g}s")
        self.gen = nxt

    def stop_watch(self) -> None:
        """Stop watching the current generation's end (it is being left, or the run closed)."""
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        install_optimizer_guard(None)

    # ---- recovering in the new generation ------------------------------------------------------------------
    def recover(self, snapshot: Snapshot | None, state: Any) -> tuple[int | None, dict[str, float] | None]:
        """Agree on the newest step any rank holds and load it everywhere; None when nobody holds one. Also
        the live totals of the rank that sent the state (:meth:`snapshot`), on every rank (else None).

        A collective over the new group: every rank calls it from ``Run.restore``.
        """
        import torch
        import torch.distributed as dist

        have = torch.tensor([snapshot.step if snapshot is not None else -1], dtype=torch.int64)
        steps = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(steps, have, group=self._ctl)
        values = [int(t.item()) for t in steps]
        best = max(values)
        if best <= 0:
            return None, None
        source = values.index(best)
        from goodput.checkpoint.transfer import broadcast_state

        parts = snapshot.parts if self.rank == source and snapshot is not None else None
        sent = broadcast_state(parts, source, self._ctl)
        state.load_live_state_dict(sent)
        if self.resized:
            self._resized_rng(best, state, json.loads(sent.get("loader") or "null"))
        else:
            self._restore_rng(best)
        state.step = best
        return best, json.loads(sent.get(_LIVE) or "null")

    def _restore_rng(self, step: int) -> None:
        from goodput.checkpoint.rng import restore_rng_record

        record = self._rng_records.read(step)
        if record is not None:
            # The record of the adopted step. An older one (the dead rank's backward never reached its model's
            # outputs, and it died after its gradients' all-reduce but before its optimizer step's record) is
            # the best the job still has: documented (docs/warm-restarts.md) as a case where a replacement's
            # randomness may differ.
            self._pending_rng = functools.partial(restore_rng_record, record[1])

    def _resized_rng(self, step: int, state: Any, loader: Any) -> None:
        """After a shrink or grow, the streams a cold resume on the new world would give this rank
        (:mod:`goodput.warm.streams`): old rank ``self.rank``'s record of ``step``, else a new rank's seed
        (``loader``: the data position handed on, whose seed is the run's unless ``TrainingState`` has one)."""
        from goodput.checkpoint.rng import restore_rng_record, seed_new_rank
        from goodput.warm.streams import resized_record

        assert self.info is not None  # joined
        record = resized_record(self.info, self.rank, self._rng_records.folder, step, self._ctl)
        if record is not None:
            self._pending_rng = functools.partial(restore_rng_record, record)
        else:
            self._pending_rng = functools.partial(seed_new_rank, state.new_rank_seed(loader), self.rank, step)

    def apply_rng(self) -> None:
        """Put this rank's RNG back to its record, once, right after the loader's iterator is made.

        The uninterrupted run made that iterator (which may draw from the global generator) at its epoch's
        start, before the recorded step; restoring after it continues the streams exactly where they were.
        """
        if self._pending_rng is not None:
            self._pending_rng()
            self._pending_rng = None
        self._rng.reset()  # the states may have been set (here, or by a checkpoint's restore)

    def recovered(self) -> None:
        """Tell the agent this rank finished its warm recovery."""
        self.store.recovered(self.gen)

    def parts(self, restore_seconds: float, survivor: bool) -> dict[str, Any]:
        """The restart's timeline for the ledger (seconds), as far as this rank saw it (a ``survivor`` of the
        failed generation, else its replacement)."""
        info = self.info
        assert info is not None  # joined
        detected = info.detected_wall if info.detected_wall is not None else self.joined_wall
        handover = info.handover_wall if info.handover_wall is not None else detected
        failed = min(detected, self._failed_wall or detected)
        role = "survivor" if survivor else "replacement"
        return {
            "generation": self.gen,
            "kind": info.kind,
            "failed_ranks": info.failed,
            "role": role,
            "detection_seconds": round(max(0.0, detected - failed), 6),
            "handover_seconds": round(max(0.0, handover - detected), 6),
            "reform_seconds": round(max(0.0, self.joined_wall - handover), 6),
            # a survivor's wait in its failed collective after the agent saw the failure
            "left_seconds": round(max(0.0, (self._failed_wall or detected) - detected), 6),
            "restore_seconds": round(restore_seconds, 6),
            "spare_wait_seconds": self.spare_wait if role == "replacement" else None,
            "store_ops": operations_since(self._ops_before),
        }
