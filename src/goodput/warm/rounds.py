"""The warm agents' rendezvous: torch elastic's c10d ``DynamicRendezvousHandler``, one round per membership
change, as torchrun's agents use it.

The first round starts the job with the nodes there (``--nnodes MIN:MAX``: at least MIN, at most MAX, within
``last_call_timeout`` of the MIN-th). A node that comes later (a new ``goodput launch`` with the same endpoint
and id: a replacement machine, or one more) finds the round complete and waits in the handler's wait list; the
running agents see it in ``num_nodes_waiting()`` and each joins the next round, as torchrun's agent does. A
node lost whole leaves the rendezvous when its keep-alive expires; so does a running node whose agent stalled
longer than the keep-alive allows (torch then never beats for it again); its agent joins the next round that
another node forms (:func:`to_join`). The round only admits the node: it is taken
into the training at a step boundary by a ``grow`` generation of its own spares (``goodput.warm.resize``), and
its ranks receive the state from a replica; the running workers never stop for the round.

Whether a round started the job or admitted a node into a running one, the round's rank 0 says in the round's
own store (a counter of rounds in the job's store: the first round is the job's start).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from goodput.errors import ConfigError
from goodput.launch.launcher import LaunchConfig, rdzv_conf
from goodput.warm.store import WarmStore

__all__ = ["Round", "next_round", "node_counts", "rendezvous", "stop_keep_alive", "to_join"]


@dataclasses.dataclass(frozen=True)
class Round:
    """This agent's place in a completed rendezvous round."""

    rank: int  # torch's rank of this node in the round
    nodes: int  # the nodes in the round
    first: bool  # whether the round started the job (else it admitted a node into a running job)


def node_counts(launch: LaunchConfig) -> tuple[int, int]:
    """``--nnodes`` as (MIN, MAX)."""
    low, _, high = launch.nnodes.partition(":")
    return int(low), int(high or low)


def rendezvous(launch: LaunchConfig) -> Any:
    """The c10d rendezvous handler of ``launch`` (it must stay alive: on the node that hosts the store it owns
    the server). Its settings are ``--rdzv-timeout`` and the user's ``PET_RDZV_CONF``, as torchrun's."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    if launch.rdzv_endpoint is None:
        raise ConfigError("--restart warm with --nnodes > 1 needs --rdzv-endpoint HOST:PORT")
    low, high = node_counts(launch)
    conf = dict(item.split("=", 1) for item in rdzv_conf(launch.rdzv_timeout).split(",") if "=" in item)
    params = RendezvousParameters(
        backend="c10d",
        endpoint=launch.rdzv_endpoint,
        run_id=launch.rdzv_id,
        min_nodes=low,
        max_nodes=high,
        local_addr="127.0.0.1" if launch.rdzv_endpoint.startswith(("127.0.0.1:", "localhost:")) else None,
        **{key.strip(): value.strip() for key, value in conf.items()},
    )
    return get_rendezvous_handler(params)


def next_round(handler: Any, store: WarmStore) -> Round:
    """Join the rendezvous's next round (blocks until it completes); ``store`` is the job's store."""
    info = handler.next_rendezvous()
    round_store = WarmStore(info.store)
    if info.rank == 0:
        round_store.mark_first_round(store.count_round() == 1)
    return Round(rank=info.rank, nodes=info.world_size, first=round_store.first_round())


def to_join(handler: Any) -> tuple[int, bool]:
    """Why this running node should join the rendezvous's next round: (the nodes waiting in it, whether the
    rendezvous dropped this node while another node waits in a round it has opened). It reads the rendezvous
    state from the store.

    A node whose keep-alive went unanswered for ``keep_alive_interval x keep_alive_max_attempt`` (its agent
    stalled: a loaded machine, a paused process) is removed from the round by whichever node reads the state
    next, and torch's handler never beats for it again. Were both nodes of a two-node round removed that way
    (the other lost whole), a node launched again would wait as the next round's only participant, and this
    node, in no list, would never see it waiting. Only a round still forming counts: its participants are in
    their join, alive, so this node's join completes it once it holds MIN nodes (at once on two). A node
    dropped from a complete round is not asked to join: a participant there may be a node lost a moment ago and
    not yet expired, and the join would wait for it with the agent's monitoring stopped; such a node joins when
    that round ends and another forms.
    torch's handler keeps its state private (``_state_holder``, ``_this_node``); without them this says only
    who waits."""
    waiting = handler.num_nodes_waiting()
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    node = getattr(handler, "_this_node", None)
    if state is None or node is None:
        return waiting, False
    forming = not state.complete and bool(set(state.participants) - {node})
    return waiting, forming and node not in state.participants


def stop_keep_alive(handler: Any) -> None:
    """Stop the handler's keep-alive thread and wait for it (the agent is leaving). It beats in the store every
    ``keep_alive_interval``; one still inside that store call when the process exits aborts it (SIGABRT), as when
    the store's host closes it at the job's end. torch's handler has no public call that stops the thread without
    also closing the rendezvous to nodes that may still join."""
    stop = getattr(handler, "_stop_heartbeats", None)
    if stop is not None:
        stop()
