"""The warm-restart protocol between the agent (``goodput.warm.agent``) and its workers and spares
(``goodput.warm.worker``): every store key and every ``GOODPUT_WARM_*`` variable, declared once and typed.

The agent's TCP store outlives every worker; the keys below are all the two sides exchange through it (the
meaning of each is in ``goodput.warm.worker``'s docstring). The variables are the agent's word to a process it
starts (see ``goodput._env``).
"""

from __future__ import annotations

from goodput._env import (
    WARM_GEN,
    WARM_PG_TIMEOUT,
    WARM_PREFIX,
    WARM_REFORM_TIMEOUT,
    WARM_ROLE,
    WARM_SPARE_ID,
    WARM_STORE,
)

__all__ = [
    "COUNTER_KEY",
    "CURRENT_KEY",
    "GEN_ENV",
    "JOINED_KEY",
    "NODES_DONE_KEY",
    "PG_TIMEOUT_ENV",
    "PREFIX_ENV",
    "REFORM_TIMEOUT_ENV",
    "ROLE_ENV",
    "ROUNDS_KEY",
    "SHARDED_KEY",
    "SPARE_ENV",
    "STORE_ENV",
    "WARM_GEN",
    "WARM_PG_TIMEOUT",
    "WARM_PREFIX",
    "WARM_REFORM_TIMEOUT",
    "WARM_ROLE",
    "WARM_SPARE_ID",
    "WARM_STORE",
    "arrived_key",
    "beat_key",
    "everyone_key",
    "group_prefix",
    "info_key",
    "next_key",
    "recovered_key",
    "spare_assign_key",
    "spare_ready_key",
    "stepped_key",
]

# The variables' names, for the environments the agent builds.
STORE_ENV = WARM_STORE.name
ROLE_ENV = WARM_ROLE.name
GEN_ENV = WARM_GEN.name
SPARE_ENV = WARM_SPARE_ID.name
PREFIX_ENV = WARM_PREFIX.name
PG_TIMEOUT_ENV = WARM_PG_TIMEOUT.name
REFORM_TIMEOUT_ENV = WARM_REFORM_TIMEOUT.name

CURRENT_KEY = "gen/current"  # the generation now running
COUNTER_KEY = "gen/counter"  # the last generation number handed out
NODES_DONE_KEY = "nodes_done"  # a counter each node's agent bumps when its ranks are done (several nodes)
ROUNDS_KEY = (
    "rdzv/rounds"  # a counter of the rendezvous rounds the job's agents completed (goodput.warm.rounds)
)
JOINED_KEY = "node/joined"  # a counter of the nodes that joined the running job (each takes a new node id)
SHARDED_KEY = "job/sharded"  # set by a rank whose model holds no full replica (FSDP): the job cannot shrink


def info_key(gen: int) -> str:
    """JSON the agent writes before generation ``gen`` forms (kind, failed ranks, timings)."""
    return f"gen/{gen}/info"


def next_key(gen: int) -> str:
    """JSON ``{"gen": g2}``: generation ``gen`` ended; its survivors join ``g2``."""
    return f"gen/{gen}/next"


def recovered_key(gen: int) -> str:
    """A counter each rank of ``gen`` bumps once it recovered."""
    return f"gen/{gen}/recovered"


def arrived_key(gen: int) -> str:
    """A counter each rank of ``gen`` bumps when it joins."""
    return f"gen/{gen}/arrived"


def everyone_key(gen: int) -> str:
    """Set by the last rank of ``gen`` to arrive."""
    return f"gen/{gen}/everyone"


def group_prefix(gen: int) -> str:
    """The store namespace of generation ``gen``'s process group."""
    return f"pg/{gen}"


def spare_ready_key(spare: str) -> str:
    """A spare announces itself (its pid) under this key."""
    return f"spare/{spare}/ready"


def spare_assign_key(spare: str) -> str:
    """JSON the agent writes to hand a spare its rank and generation."""
    return f"spare/{spare}/assign"


def stepped_key(rank: int) -> str:
    """Set once, at ``rank``'s first completed step."""
    return f"stepped/{rank}"


def beat_key(node: int) -> str:
    """A counter node ``node``'s agent adds 1 to every half second: its heartbeat (``goodput.warm.nodes``)."""
    return f"node/{node}/beat"
