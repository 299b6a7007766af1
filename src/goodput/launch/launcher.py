"""``goodput launch``: a thin front over torchrun (torch.distributed.run), which does the restarting.

goodput adds these around torchrun and re-implements none of it:

* the run folder, the fault plan, the crash-loop limit and consent to a fresh start reach every worker through
  environment variables (``GOODPUT_RUN_DIR``, ``GOODPUT_FAULTS``, ``GOODPUT_CRASH_LOOP``,
  ``GOODPUT_ALLOW_FRESH_START``), so they work on every node and rank;
* single-node jobs use torchrun's ``--standalone`` c10d rendezvous on a free local port; multi-node jobs pass
  ``--nnodes``/``--node-rank``/``--rdzv-endpoint``/``--rdzv-id`` through to torchrun's c10d rendezvous, with
  ``--rdzv-timeout`` as its timeouts; a node whose rendezvous lost a node for good ends with ``EXIT_PREEMPTED``
  (see ``goodput.launch.rendezvous``);
* a launch folder (see ``goodput.job.folder``) where workers report a crash loop, an error a restart cannot
  fix (``ConfigError``, ``StateMismatch``, ``FingerprintMismatch``, ``NoValidCheckpoint``) and a preemption save; the launcher stops
  torchrun at once instead of burning the restart budget, prints one line (quoting the failing rank's last
  error, read from torch's per-worker error files) and exits with ``EXIT_CRASH_LOOP`` or ``EXIT_FATAL``;
* a quiet terminal (``goodput.launch.output``): the workers' prints, one line per failure and the final line;
  the full logs in the launch folder (``verbose`` for everything on the terminal);
* preemption (``goodput.run.signals``, ``goodput.job.signals``): the first SIGTERM, SIGINT or ``--preempt-signal`` makes every rank
  finish its step and the job save once within ``--grace`` seconds, then exit with ``EXIT_PREEMPTED``; a
  second one stops everything at once. Whatever happens, no process of the job outlives the launcher.

Reliable restarts with gloo need a store without the dead attempt's keys. The launcher sets
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, so every rendezvous round gets a fresh store hosted by the new rank 0
on a fresh port (consistent across nodes, whatever each agent's restart count). Under a plain ``torchrun``,
whose workers share the agent's long-lived store, ``init_distributed`` namespaces the store by the attempt
instead (see ``goodput.distributed``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys

from goodput.errors import ConfigError, check_at_least

__all__ = [
    "LaunchConfig",
    "launch_job",
    "rdzv_conf",
    "torchrun_command",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How to launch a training script under torchrun.

    Args:
        script: the training script and its arguments.
        nproc: worker processes per node.
        nnodes: nodes (``"2"`` or an elastic range ``"1:2"``).
        node_rank: this node's rank, for static multi-node launches.
        rdzv_endpoint: ``host:port`` of the c10d rendezvous (multi-node); None means a standalone job.
        rdzv_id: the job id shared by every node.
        rdzv_timeout: seconds a multi-node rendezvous waits for every node to join, and for the node that hosts
            its store to answer; past it the surviving nodes end with ``EXIT_PREEMPTED`` (requeue) instead of
            waiting torchrun's 600 s.
        max_restarts: how many times torchrun restarts the worker group.
        run_dir: the run folder, exported to workers as ``GOODPUT_RUN_DIR``.
        faults: a fault plan (see goodput.faults), exported as ``GOODPUT_FAULTS``.
        crash_loop: consecutive attempts without progress that count as a crash loop.
        monitor_interval: seconds between torchrun's checks of its workers.
        preempt_signal: the early-warning signal (besides SIGTERM and SIGINT) that starts a preemption save,
            e.g. ``"USR1"`` for SLURM's ``--signal=USR1@90``; the launcher forwards it to every rank.
        grace: seconds from the first signal for the preemption save before everything is ended.
        verbose: leave torchrun's and every worker's output on the terminal as torchrun prints it; by default
            the terminal shows the workers' prints without tracebacks and one line per failure, and the full
            logs go to the launch folder (see ``goodput.launch.output``).
        allow_fresh_start: a run whose committed checkpoints all fail to load starts from step 0 instead of
            stopping (exported as ``GOODPUT_ALLOW_FRESH_START=1``; see ``CheckpointConfig.allow_fresh_start``).
    """

    script: tuple[str, ...]
    nproc: int = 1
    nnodes: str = "1"
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str = "goodput"
    rdzv_timeout: float = 300.0
    max_restarts: int = 3
    run_dir: str | None = None
    faults: str = ""
    crash_loop: int = 3
    monitor_interval: float = 0.1
    preempt_signal: str = "USR1"
    grace: float = 60.0
    verbose: bool = False
    allow_fresh_start: bool = False

    def __post_init__(self) -> None:
        if not self.script:
            raise ConfigError("launch needs a script after '--', e.g. goodput launch -- train.py --lr 1e-3")
        check_at_least("--nproc", self.nproc, 1)
        check_at_least("--max-restarts", self.max_restarts, 0)
        check_at_least("--crash-loop", self.crash_loop, 1)
        if self.nnodes != "1" and self.rdzv_endpoint is None:
            raise ConfigError(f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT shared by every node")
        if self.rdzv_timeout < 1:
            raise ConfigError(f"--rdzv-timeout must be at least 1 second, got {self.rdzv_timeout:g}")
        if self.run_dir is not None and os.path.exists(self.run_dir) and not os.path.isdir(self.run_dir):
            raise ConfigError(f"--run-dir {self.run_dir!r} is a file; pass a folder")
        if self.grace <= 0:
            raise ConfigError(f"--grace must be > 0 seconds, got {self.grace}")
        from goodput.job.signals import parse_signal

        parse_signal(self.preempt_signal)
        if self.faults:
            from goodput.faults import check_plan, parse_faults

            # Fail here, once, rather than in every worker; a fault that can never fire is refused too.
            check_plan(parse_faults(self.faults), world_size=self.max_world_size)

    @property
    def max_world_size(self) -> int:
        """The most ranks this launch can have (``nproc`` x the largest ``nnodes``)."""
        nodes = self.nnodes.rsplit(":", 1)[-1]
        if not nodes.isdigit() or int(nodes) < 1:
            raise ConfigError(f"--nnodes must be N or MIN:MAX with whole numbers >= 1, got {self.nnodes!r}")
        return self.nproc * int(nodes)


def torchrun_command(config: LaunchConfig, *, log_dir: str | None = None) -> list[str]:
    """The torchrun command line for a launch (``python -m torch.distributed.run ...``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={config.nproc}"]
    if log_dir is not None:
        cmd.append(f"--log-dir={log_dir}")  # where torch's per-worker error files land
        if not config.verbose:
            cmd.append("--redirects=3")  # and each worker's stdout and stderr, which the launcher follows
    host = None if config.rdzv_endpoint is None else config.rdzv_endpoint.rsplit(":", 1)[0]
    if host in (None, "127.0.0.1", "localhost"):
        # A job on this machine only: keep every connection on the loopback address (torchrun would
        # otherwise advertise the host name's address).
        cmd.append("--local-addr=127.0.0.1")
    if config.rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        cmd += [
            f"--nnodes={config.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={config.rdzv_endpoint}",
            f"--rdzv-id={config.rdzv_id}",
            f"--rdzv-conf={rdzv_conf(config.rdzv_timeout)}",
        ]
        if config.node_rank is not None:
            cmd.append(f"--node-rank={config.node_rank}")
    cmd += [f"--max-restarts={config.max_restarts}", f"--monitor-interval={config.monitor_interval}"]
    if os.path.isfile(config.script[0]):  # python -u -m goodput.warm.boot SCRIPT: a faster start (see there)
        cmd += ["--module", "goodput.warm.boot"]
    return cmd + list(config.script)


def rdzv_conf(timeout: float) -> str:
    """torchrun's ``--rdzv-conf``: the user's ``PET_RDZV_CONF`` (torchrun's own variable, which a command-line
    ``--rdzv-conf`` would hide), with ``timeout`` for what it leaves unset.

    ``join_timeout`` bounds each rendezvous round (a lost node that does not come back: torch's default is
    600 s); ``read_timeout`` bounds each call to the rendezvous store, whose host, lost without closing its
    connections, answers nothing (torch's default, 60 s, unless ``timeout`` is shorter). See
    ``goodput.launch.rendezvous``.
    """
    conf = [item for item in os.environ.get("PET_RDZV_CONF", "").split(",") if item.strip()]
    given = {item.split("=", 1)[0].strip() for item in conf}
    timeouts = {"join_timeout": math.ceil(timeout), "read_timeout": math.ceil(min(timeout, 60.0))}
    conf += [f"{key}={seconds}" for key, seconds in timeouts.items() if key not in given]
    return ",".join(conf)


def launch_job(config: LaunchConfig) -> int:
    """Run torchrun for ``config``; returns its exit status, or one of the EXIT_* codes (``goodput.job.codes``).

    Raises:
        ConfigError: before anything starts, for a script or run folder that cannot work (see
            ``goodput.launch.preflight``).
    """
    from goodput.launch.preflight import check_before_launch
    from goodput.launch.supervise import Supervisor

    check_before_launch(config)
    return Supervisor(config).run()
