"""The warm-restart protocol between the agent (``goodput.warm.agent``) and its workers and spares
(``goodput.warm.worker``): every store key and every payload, declared once and typed.

The agent's TCP store outlives every worker; the keys below are all the two sides exchange through it, and
``goodput.warm.store.WarmStore`` is the one place that reads or writes them. A key holds either a counter (the
store's own ``add``), a plain number, or one of the payloads below as JSON tagged with what it is and ``FORMAT``:
a payload of another format (another goodput version in the same job, or a writer that is not goodput) is
refused with ``ProtocolMismatch``. The ``GOODPUT_WARM_*`` variables, the agent's word to a process it starts,
are declared in ``goodput._env``. Torch-free. The keys:

* ``gen/<g>/info``      the ``Generation`` the agent writes before generation ``g`` forms: ``kind`` ("cold": every
  process is new and restores from the newest checkpoint; "warm": survivors and a replacement recover live),
  the failed ranks and the agent's detection and hand-over times.
* ``gen/<g>/next``      the ``Successor`` ``g2``: generation ``g`` has ended; its survivors join ``g2``. Each rank
  watches for it in a thread (:mod:`goodput.warm.watch`): from then on no optimizer step applies, and a
  collective blocked on the dead peer, or on a survivor that left, returns at once (NCCL: the communicators
  are aborted; gloo: the generation's connections are hung up, :mod:`goodput.warm.hangup`).
* ``pg/<g>/...``        the store namespace of generation ``g``'s process group (a fresh prefix per
  generation, so nobody reads a dead peer's address).
* ``gen/<g>/settled``   set by the last rank to arrive in ``g`` (``gen/<g>/everyone`` beside it) or, when ``g``
  ends before it formed, by the agent: each rank blocks on this one key until its group can form or never will.
* ``gen/<g>/recovered`` a counter each rank bumps when it has recovered: the agent's sign the warm restart
  worked (else, after a timeout, it restarts the whole group cold).
* ``spare/<k>/ready``, ``spare/<k>/assign``: a spare announces itself, then waits inside ``Run()`` (torch and the
  script's imports already loaded) until the agent hands it a rank and a generation.
* ``stepped/<rank>``    set once, at a rank's first completed step (the agent starts the first spares then).
* ``job/complete``      the ``Complete`` of the first rank that closed its run at the job's last step with that
  step committed: a restart the agent still has pending then has nothing to recover, so the job ends.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Generic, TypeVar

from goodput.errors import ProtocolMismatch

__all__ = [
    "COMPLETE_KEY",
    "COUNTER_KEY",
    "CURRENT_KEY",
    "FIRST_ROUND_KEY",
    "FORMAT",
    "JOINED_KEY",
    "LIVE_KINDS",
    "NODES_DONE_KEY",
    "ROUNDS_KEY",
    "SHARDED_KEY",
    "Assignment",
    "Complete",
    "Generation",
    "Layout",
    "Successor",
    "arrived_key",
    "beat_key",
    "decode",
    "encode",
    "everyone_key",
    "group_prefix",
    "info_key",
    "next_key",
    "recovered_key",
    "settled_key",
    "spare_assign_key",
    "spare_ready_key",
    "stepped_key",
]

FORMAT = 1  # the payloads' wire format; a change that an older reader would misread takes the next number

Layout = dict[int, list[int]]  # node rank -> the global ranks it holds, ascending

CURRENT_KEY = "gen/current"  # the generation now running
COUNTER_KEY = "gen/counter"  # the last generation number handed out
NODES_DONE_KEY = "nodes_done"  # a counter each node's agent bumps when its ranks are done (several nodes)
ROUNDS_KEY = (
    "rdzv/rounds"  # a counter of the rendezvous rounds the job's agents completed (goodput.warm.rounds)
)
FIRST_ROUND_KEY = "goodput/first"  # in a rendezvous round's own store: "1" when the round started the job
JOINED_KEY = "node/joined"  # a counter of the nodes that joined the running job (each takes a new node id)
SHARDED_KEY = "job/sharded"  # set by a rank whose model holds no full replica (FSDP): the job cannot shrink
COMPLETE_KEY = "job/complete"  # the ``Complete`` a rank writes once it closed at the last step, committed

LIVE_KINDS = ("warm", "shrink", "grow")  # the generations that recover from the survivors' replicas


@dataclasses.dataclass(frozen=True)
class Generation:
    """What the agent publishes before generation ``gen`` forms (``info_key``).

    ``kind`` is "cold" (every process is new and restores from the newest checkpoint), "warm" (a spare took
    the failed ranks), "shrink" or "grow" (the survivors are renumbered by ``ranks``, old -> new, into
    ``world_size`` ranks laid out over the nodes as ``nodes``). The walls are ``time.time()`` of the agent.
    """

    gen: int
    kind: str
    failed: list[int] = dataclasses.field(default_factory=list)
    from_gen: int | None = None
    reason: str | None = None  # why a cold restart
    nodes: Layout | None = None  # None: a one-node job that never resized
    ranks: dict[int, int] | None = None
    world_size: int | None = None
    world_before: int | None = None
    joined: int | None = None  # a grow's newcomers
    detected_wall: float | None = None
    handover_wall: float | None = None
    ready_wall: float | None = None  # a grow: when its spares were seen ready

    @property
    def live(self) -> bool:
        """Whether the generation recovers from the survivors' replicas rather than a checkpoint."""
        return self.kind in LIVE_KINDS


@dataclasses.dataclass(frozen=True)
class Assignment:
    """The agent's hand-over of a rank to a hot spare (``spare_assign_key``)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    gen: int
    restart_count: int


@dataclasses.dataclass(frozen=True)
class Successor:
    """Generation ``next_key(g)``'s end: its survivors join generation ``gen``."""

    gen: int


@dataclasses.dataclass(frozen=True)
class Complete:
    """The job's end (``COMPLETE_KEY``): rank ``rank`` of generation ``gen`` closed its run at ``step``, the job's
    last, with that step's checkpoint committed. A restart still pending then has nothing left to recover."""

    rank: int
    step: int
    gen: int


_Payload = TypeVar("_Payload", Generation, Assignment, Successor, Complete)
_Of = TypeVar("_Of", int, str)
_KINDS: dict[type, str] = {
    Generation: "generation",
    Assignment: "assignment",
    Successor: "successor",
    Complete: "complete",
}
_INT_KEYED = ("nodes", "ranks")  # JSON objects have string keys; these maps have int keys


def encode(payload: Generation | Assignment | Successor | Complete) -> str:
    """``payload`` as it travels in the store: JSON tagged with what it is and ``FORMAT``."""
    fields = dataclasses.asdict(payload)
    for name in _INT_KEYED:
        if fields.get(name) is not None:
            fields[name] = {str(key): value for key, value in fields[name].items()}
    return json.dumps({"format": FORMAT, "payload": _KINDS[type(payload)], **fields})


def decode(cls: type[_Payload], raw: bytes | str, key: str) -> _Payload:
    """The ``cls`` payload that key ``key`` held as ``raw``.

    Raises:
        ProtocolMismatch: ``raw`` is not a ``cls`` payload of this ``FORMAT`` (another goodput version of the
            job's processes wrote it, or something that is not goodput).
    """
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        data: Any = json.loads(text)
    except ValueError:
        data = None
    what = _KINDS[cls]
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("payload") != what:
        raise ProtocolMismatch(
            f"warm store key {key!r} holds {text[:120]!r}, not a {what} of goodput's format {FORMAT}: every "
            "process of the job must run the same goodput version, and nothing else may write the job's store"
        )
    fields = {name: value for name, value in data.items() if name not in ("format", "payload")}
    for name in _INT_KEYED:
        if fields.get(name) is not None:
            fields[name] = {int(k): v for k, v in fields[name].items()}
    try:
        return cls(**fields)
    except TypeError as err:
        raise ProtocolMismatch(f"warm store key {key!r}: a {what} with other fields ({err})") from None


class _Key(Generic[_Of]):
    """The store key of one generation, rank, node or spare: ``pattern`` with the value put in."""

    def __init__(self, pattern: str, doc: str) -> None:
        self.pattern = pattern
        self.__doc__ = doc

    def __call__(self, value: _Of) -> str:
        return self.pattern.format(value)


info_key: _Key[int] = _Key(
    "gen/{}/info", "The ``Generation`` the agent writes before generation ``gen`` forms."
)
next_key: _Key[int] = _Key(
    "gen/{}/next",
    "The ``Successor`` of generation ``gen``: set once, when it ended (a compare-and-set: one winner).",
)
recovered_key: _Key[int] = _Key("gen/{}/recovered", "A counter each rank of ``gen`` bumps once it recovered.")
arrived_key: _Key[int] = _Key("gen/{}/arrived", "A counter each rank of ``gen`` bumps when it joins.")
everyone_key: _Key[int] = _Key("gen/{}/everyone", "Set by the last rank of ``gen`` to arrive.")
settled_key: _Key[int] = _Key(
    "gen/{}/settled",
    "Set when generation ``gen`` is settled: its last rank arrived, or the agent ended it before. One key each "
    "rank can block on for both, so a rank waiting for its group costs the store no polling.",
)
group_prefix: _Key[int] = _Key("pg/{}", "The store namespace of generation ``gen``'s process group.")
spare_ready_key: _Key[str] = _Key("spare/{}/ready", "A spare announces itself (its pid) under this key.")
spare_assign_key: _Key[str] = _Key(
    "spare/{}/assign",
    "The ``Assignment`` that hands a spare its rank and generation (a compare-and-set: one winner).",
)
stepped_key: _Key[int] = _Key("stepped/{}", "Set once, at ``rank``'s first completed step.")
beat_key: _Key[int] = _Key(
    "node/{}/beat",
    "A counter node ``node``'s agent adds 1 to every half second: its heartbeat (``goodput.warm.nodes``).",
)
