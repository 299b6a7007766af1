"""Goodput at cluster scale: checkpoint and restart costs from a job's state size and bandwidths. Pure.

A cluster of ``N`` GPUs fails at a rate proportional to ``N`` (Llama 3's observed 8.6 interruptions a day on
16,384 GPUs, scaled per GPU, unless told otherwise). Each GPU holds ``state_per_gpu`` bytes of training state
(its shard of the weights and optimizer). What a checkpoint and a restart cost follows from three bandwidths:

- device to host, per GPU: staging a copy of the state (an async save's stall, a memory-tier save);
- to a peer node, per GPU: the memory tier's replica, and a replacement receiving the state after a failure;
- storage, aggregate: every GPU's state written or read at once, so its time grows with ``N``.

Each such floor is multiplied by what goodput's benchmarks measured against the same floor on real saves
and restores (:class:`MeasuredRatios`; docs/scale.md names the runs), so the figures are "as measured here,
at the stated bandwidths". Four ways to run the job are compared (:data:`STRATEGIES`):

- ``baseline``: a synchronous save to storage (``torch.save`` or DCP), cold restarts from storage;
- ``durable_async``: goodput's async DCP save (only the staging copy blocks), cold restarts from storage;
- ``memory_cold``: goodput's memory tier (RAM plus a peer node's replica) beside the durable tier, cold
  restarts (the processes start again, then load the newest memory checkpoint);
- ``memory_warm``: the same tiers, warm restarts (survivors keep their processes; a hot spare receives the
  lost rank's state from a peer).

Single-level plans use Daly's exact model at its optimum interval; two-level plans use the first-order
two-level model of :mod:`goodput.planning.twolevel`, each at its optimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from goodput.errors import ConfigError
from goodput.planning.model import DAY, Costs, goodput_daly, optimal_interval
from goodput.planning.twolevel import TwoLevelCosts, durable_share, plan_two_level

__all__ = [
    "LLAMA3_FAILURES_PER_DAY",
    "LLAMA3_GPUS",
    "STRATEGIES",
    "Cluster",
    "MeasuredRatios",
    "ScalePoint",
    "cluster_goodput",
    "failures_per_day",
]

LLAMA3_GPUS = 16_384
LLAMA3_FAILURES_PER_DAY = 8.6  # 466 job interruptions in a 54-day snapshot (Llama 3 paper, section 3.3.4)
STRATEGIES = ("baseline", "durable_async", "memory_cold", "memory_warm")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """The hardware and failure assumptions (bytes, bytes per second, seconds).

    Attributes:
        state_per_gpu: training state one GPU holds and checkpoints.
        host_bandwidth: device-to-host copy bandwidth of one GPU.
        peer_bandwidth: one GPU's share of its node's network bandwidth to another node.
        storage_bandwidth: aggregate write (and read) bandwidth of the checkpoint storage.
        cold_restart: a failure to training again when every process starts again (detection, scheduling,
            process start, initialisation), without the checkpoint load.
        failures_per_day: interruptions a day observed on ``observed_gpus`` GPUs (scaled per GPU).
        observed_gpus: the cluster size of that observation.
        node_loss_share: share of failures that lose a node's RAM (the memory tier's replica on a peer node
            covers them unless the peer is lost too).
    """

    state_per_gpu: float = 4e9
    host_bandwidth: float = 50e9
    peer_bandwidth: float = 50e9
    storage_bandwidth: float = 2e12
    cold_restart: float = 300.0
    failures_per_day: float = LLAMA3_FAILURES_PER_DAY
    observed_gpus: int = LLAMA3_GPUS
    node_loss_share: float = 0.3

    def __post_init__(self) -> None:
        for name in (
            "state_per_gpu",
            "host_bandwidth",
            "peer_bandwidth",
            "storage_bandwidth",
            "failures_per_day",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"Cluster.{name} must be > 0, got {value!r}")
        if not (math.isfinite(self.cold_restart) and self.cold_restart >= 0):
            raise ConfigError(f"Cluster.cold_restart must be >= 0 seconds, got {self.cold_restart!r}")
        if self.observed_gpus < 1:
            raise ConfigError(f"Cluster.observed_gpus must be >= 1, got {self.observed_gpus!r}")
        if not 0.0 <= self.node_loss_share <= 1.0:
            raise ConfigError(f"Cluster.node_loss_share must be in [0, 1], got {self.node_loss_share!r}")


@dataclass(frozen=True, kw_only=True)
class MeasuredRatios:
    """Measured cost over its floor, from goodput's benchmarks (each >= 0; 1.0 means "at the floor").

    Attributes:
        durable_write: a DCP save's time to durable over the best raw write of the same bytes.
        durable_read: a DCP restore over a raw read of the same bytes.
        async_stall: an async save's blocking stall over a copy of the state into preallocated buffers.
        memory_stall: a memory-tier save's stall over the same copy.
        memory_restore: a memory-tier restore over the same copy.
        warm_over_cold_restart: a warm restart's downtime over a cold restart's (without checkpoint loads).
    """

    durable_write: float = 1.14
    durable_read: float = 1.3
    async_stall: float = 1.06
    memory_stall: float = 1.0
    memory_restore: float = 1.3
    warm_over_cold_restart: float = 1 / 12.3

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"MeasuredRatios.{name} must be > 0, got {value!r}")


@dataclass(frozen=True)
class ScalePoint:
    """One strategy at one cluster size: its goodput and the costs that gave it (seconds)."""

    gpus: int
    strategy: str
    goodput: float
    mtbf: float
    stall: float
    persist: float
    restart: float
    interval: float
    memory: dict[str, float] = field(default_factory=dict)  # the memory tier's c1, w1, r1, interval, share


def failures_per_day(gpus: int, cluster: Cluster) -> float:
    """Interruptions a day of a job on ``gpus`` GPUs: the observed rate scaled per GPU."""
    return cluster.failures_per_day * gpus / cluster.observed_gpus


def cluster_goodput(gpus: int, cluster: Cluster, ratios: MeasuredRatios, strategy: str) -> ScalePoint:
    """Goodput of ``strategy`` (one of :data:`STRATEGIES`) on ``gpus`` GPUs, at its optimum interval(s).

    Raises:
        ConfigError: an unknown strategy or a non-positive GPU count.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if gpus < 1:
        raise ConfigError(f"gpus must be >= 1, got {gpus!r}")
    mtbf = DAY / failures_per_day(gpus, cluster)
    storage = gpus * cluster.state_per_gpu / cluster.storage_bandwidth  # all GPUs at once, shared storage
    copy = cluster.state_per_gpu / cluster.host_bandwidth
    write, read = storage * ratios.durable_write, storage * ratios.durable_read
    cold = cluster.cold_restart + read
    if strategy in ("baseline", "durable_async"):
        stall, persist = (write, 0.0) if strategy == "baseline" else (copy * ratios.async_stall, write)
        costs = Costs(ckpt_stall=stall, mtbf=mtbf, restart=cold, persist=persist)
        tau = optimal_interval(costs)
        return ScalePoint(gpus, strategy, goodput_daly(tau, costs), mtbf, stall, persist, cold, tau)
    peer = cluster.state_per_gpu / cluster.peer_bandwidth
    c1, w1 = copy * ratios.memory_stall, peer  # the replica goes to a peer node in the background
    restart = cluster.cold_restart
    if strategy == "memory_warm":
        restart *= ratios.warm_over_cold_restart
    # survivors load their own RAM copy; the replacement receives the lost rank's copy from its peer
    r1 = restart + max(copy * ratios.memory_restore, peer)
    share = durable_share(cluster.node_loss_share, replicated=True)
    c2 = copy * ratios.async_stall
    plan = plan_two_level(
        TwoLevelCosts(c1=c1, w1=w1, c2=c2, w2=write, mtbf=mtbf, share=share, r1=r1, r2=cold)
    )
    memory = {
        "stall": c1,
        "persist": w1,
        "restart": r1,
        "interval": plan.memory_interval,
        "durable_share": share,
    }
    return ScalePoint(
        gpus, strategy, max(0.0, plan.goodput), mtbf, c2, write, cold, plan.durable_interval, memory
    )
