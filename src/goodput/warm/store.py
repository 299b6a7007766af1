"""The warm-restart store, typed: every operation the agent, its workers and spares do on the job's
torch.distributed store, as one method each over the keys and payloads of ``goodput.warm.protocol``.

Nothing else in goodput reads or writes those keys, so the protocol's rules live here: the agent publishes a
generation's ``Generation`` before its number (a reader that sees the number finds its info); a generation
ends once (a compare-and-set: of two agents ending it, one wins); a spare is assigned once.

Every operation is counted per process (``operations``): reads (``get``, ``check``, reading a counter), writes
(``set``, ``add``, ``compare_set``) and waits, so that the agent can log what each recovery cost the store.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterable
from typing import Any

from goodput.warm import protocol
from goodput.warm.protocol import Assignment, Complete, Generation, Successor

__all__ = ["WarmStore", "operations", "operations_since"]

_counts = {"reads": 0, "writes": 0, "waits": 0}  # this process's store operations, every WarmStore's
_counts_lock = threading.Lock()  # the node beat and the end watch count from threads of their own
_SPARE_WAIT = datetime.timedelta(days=7)  # a spare waits for its rank as long as the job runs


def operations() -> dict[str, int]:
    """This process's store operations so far: ``reads``, ``writes`` and ``waits``."""
    with _counts_lock:
        return dict(_counts)


def operations_since(before: dict[str, int]) -> dict[str, int]:
    """This process's store operations since ``before`` (an earlier ``operations()``)."""
    now = operations()
    return {kind: now[kind] - before.get(kind, 0) for kind in now}


def _count(kind: str) -> None:
    with _counts_lock:
        _counts[kind] += 1


class WarmStore:
    """The warm-restart protocol's operations over ``store`` (a ``torch.distributed.Store``: the agent's
    ``TCPStore``, or a ``PrefixStore`` of the job in a shared rendezvous store)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    @classmethod
    def connect(cls, address: str, prefix: str) -> WarmStore:
        """A new client connection to the agent's TCP store at ``address`` ("host:port"), in ``prefix``'s
        namespace (several nodes share the rendezvous's store)."""
        import torch.distributed as dist

        host, port = address.rsplit(":", 1)
        base = dist.TCPStore(
            host, int(port), is_master=False, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
        )
        return cls(dist.PrefixStore(prefix, base) if prefix else base)

    # ---- the counted primitives --------------------------------------------------------------------------
    def _get(self, key: str) -> bytes:
        _count("reads")
        return bytes(self._store.get(key))

    def _check(self, keys: list[str]) -> bool:
        _count("reads")
        return bool(self._store.check(keys))

    def _set(self, key: str, value: str) -> None:
        _count("writes")
        self._store.set(key, value)

    def _add(self, key: str, amount: int) -> int:
        _count("writes" if amount else "reads")
        return int(self._store.add(key, amount))

    def _set_once(self, key: str, value: str) -> bytes:
        """Set ``key`` to ``value`` unless it is set; the value it holds after."""
        _count("writes")
        return bytes(self._store.compare_set(key, "", value))

    def _wait(self, key: str, timeout: datetime.timedelta) -> None:
        _count("waits")
        self._store.wait([key], timeout)

    # ---- generations -------------------------------------------------------------------------------------
    def new_generation(self) -> int:
        """A generation number no agent of the job was given before."""
        return self._add(protocol.COUNTER_KEY, 1)

    def publish(self, info: Generation) -> None:
        """Publish generation ``info.gen`` as the current one, its info first."""
        self._set(protocol.info_key(info.gen), protocol.encode(info))
        self._set(protocol.CURRENT_KEY, str(info.gen))

    def current(self) -> int:
        """The generation now running."""
        return int(self._get(protocol.CURRENT_KEY))

    def generation(self, gen: int) -> Generation:
        """Generation ``gen``'s info (waits, up to the store's timeout, until it is published)."""
        key = protocol.info_key(gen)
        return protocol.decode(Generation, self._get(key), key)

    def end_generation(self, gen: int, successor: int) -> bool:
        """End generation ``gen`` with ``successor`` as the next one; whether this call did (another agent may
        have ended it first)."""
        key = protocol.next_key(gen)
        held = self._set_once(key, protocol.encode(Successor(gen=successor)))
        won = protocol.decode(Successor, held, key).gen == successor
        if won:  # ranks still waiting for it to form wake up and leave
            self._set(protocol.settled_key(gen), "ended")
        return won

    def ended(self, gen: int) -> bool:
        """Whether generation ``gen`` has ended."""
        return self._check([protocol.next_key(gen)])

    def wait_for_successor(self, gen: int, timeout: float) -> int | None:
        """The generation that follows ``gen``, once ``gen`` ends; None when it does not within ``timeout``
        seconds."""
        key = protocol.next_key(gen)
        try:
            self._wait(key, datetime.timedelta(seconds=timeout))
        except Exception:  # the store's timeout error type differs between torch versions
            return None
        return protocol.decode(Successor, self._get(key), key).gen

    # ---- forming and recovering a generation -------------------------------------------------------------
    def arrive(self, gen: int, world_size: int) -> None:
        """Count this rank into generation ``gen``; the last of ``world_size`` says everyone arrived."""
        if self._add(protocol.arrived_key(gen), 1) == world_size:
            self._set(protocol.everyone_key(gen), "1")
            self._set(protocol.settled_key(gen), "formed")

    def everyone_arrived(self, gen: int) -> bool:
        """Whether every rank of generation ``gen`` has arrived."""
        return self._check([protocol.everyone_key(gen)])

    def wait_settled(self, gen: int, timeout: float) -> bool | None:
        """Block until generation ``gen`` is settled: True when every rank arrived, False when it ended first,
        None when neither happened within ``timeout`` seconds. A few operations however long it waits."""
        try:
            self._wait(protocol.settled_key(gen), datetime.timedelta(seconds=timeout))
        except Exception:  # the store's timeout error type differs between torch versions
            return None
        return self.everyone_arrived(gen)

    def group_store(self, gen: int) -> Any:
        """The store namespace of generation ``gen``'s process group (``init_process_group(store=...)``)."""
        import torch.distributed as dist

        return dist.PrefixStore(protocol.group_prefix(gen), self._store)

    def recovered(self, gen: int) -> None:
        """Count this rank as recovered in generation ``gen``."""
        self._add(protocol.recovered_key(gen), 1)

    def recovered_count(self, gen: int) -> int:
        """The ranks of generation ``gen`` that have recovered."""
        return self._add(protocol.recovered_key(gen), 0)

    # ---- spares ------------------------------------------------------------------------------------------
    def announce_spare(self, spare: str, pid: int) -> None:
        """Spare ``spare`` (process ``pid``) has finished its imports."""
        self._set(protocol.spare_ready_key(spare), str(pid))

    def spare_ready(self, spare: str) -> bool:
        """Whether spare ``spare`` has announced itself."""
        return self._check([protocol.spare_ready_key(spare)])

    def assign_spare(self, spare: str, assignment: Assignment) -> bool:
        """Hand spare ``spare`` its rank; whether this call did (a spare is assigned once)."""
        key = protocol.spare_assign_key(spare)
        held = self._set_once(key, protocol.encode(assignment))
        return protocol.decode(Assignment, held, key) == assignment

    def wait_for_assignment(self, spare: str) -> Assignment:
        """Block until spare ``spare`` is assigned a rank; the assignment."""
        key = protocol.spare_assign_key(spare)
        self._wait(key, _SPARE_WAIT)
        return protocol.decode(Assignment, self._get(key), key)

    # ---- a rank's markers --------------------------------------------------------------------------------
    def mark_stepped(self, rank: int, step: int) -> None:
        """``rank`` completed its first step, ``step``."""
        self._set(protocol.stepped_key(rank), str(step))

    def all_stepped(self, ranks: Iterable[int]) -> bool:
        """Whether every rank of ``ranks`` has completed a step."""
        return self._check([protocol.stepped_key(rank) for rank in ranks])

    def mark_sharded(self, rank: int) -> None:
        """``rank``'s model holds no full replica: the job must not shrink."""
        self._set(protocol.SHARDED_KEY, str(rank))

    def sharded(self) -> bool:
        """Whether a rank said its model holds no full replica."""
        return self._check([protocol.SHARDED_KEY])

    def mark_complete(self, done: Complete) -> None:
        """The job is complete: a rank closed at its last step with that step committed (the first says)."""
        self._set_once(protocol.COMPLETE_KEY, protocol.encode(done))

    def complete(self) -> Complete | None:
        """The job's ``Complete``, once a rank wrote it; None before."""
        if not self._check([protocol.COMPLETE_KEY]):
            return None
        return protocol.decode(Complete, self._get(protocol.COMPLETE_KEY), protocol.COMPLETE_KEY)

    # ---- nodes -------------------------------------------------------------------------------------------
    def join_node(self) -> int:
        """Count a node that joined the running job; how many have joined (this one included)."""
        return self._add(protocol.JOINED_KEY, 1)

    def beat(self, node: int) -> None:
        """One heartbeat of node ``node``'s agent."""
        self._add(protocol.beat_key(node), 1)

    def beats(self, node: int) -> int:
        """Node ``node``'s heartbeats so far."""
        return self._add(protocol.beat_key(node), 0)

    def node_done(self) -> None:
        """Count this node's part of the job as done."""
        self._add(protocol.NODES_DONE_KEY, 1)

    def nodes_done(self) -> int:
        """The nodes whose part of the job is done."""
        return self._add(protocol.NODES_DONE_KEY, 0)

    def any_node_done(self) -> bool:
        """Whether some node's part of the job is done (so the job is)."""
        return self._check([protocol.NODES_DONE_KEY])

    def count_round(self) -> int:
        """Count a completed rendezvous round of the job; how many there were (this one included)."""
        return self._add(protocol.ROUNDS_KEY, 1)

    def mark_first_round(self, first: bool) -> None:
        """In a rendezvous round's own store: whether the round started the job."""
        self._set(protocol.FIRST_ROUND_KEY, "1" if first else "0")

    def first_round(self) -> bool:
        """In a rendezvous round's own store: whether the round started the job (waits for its rank 0)."""
        return self._get(protocol.FIRST_ROUND_KEY) == b"1"
