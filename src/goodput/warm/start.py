"""Starting a warm job: its configuration, what it refuses, the nodes' rendezvous, and ``launch_warm``.

The launcher around it: ``launch_warm`` runs the agent as a process under torchrun's supervisor
(``goodput.launch.supervise``), so a warm launch keeps every promise of a cold one: preemption (exit 75), the
crash-loop verdict (each generation is an attempt; exit 3), errors a restart cannot fix (a worker reports its
own as ``FATAL`` before it exits, so no spare is handed it; exit 78), and no process left behind. An elastic
``--nnodes MIN:MAX`` needs ``--shrink-after``: nodes leave and join by shrinking and growing in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
from typing import TYPE_CHECKING

from goodput._env import (
    ALLOW_FRESH_START,
    CRASH_LOOP,
    FAULTS,
    RUN_DIR,
    WARM_MIN_WORLD,
    WARM_PG_TIMEOUT,
    WARM_PREFIX,
    WARM_REFORM_TIMEOUT,
    WARM_STORE,
)
from goodput.errors import ConfigError
from goodput.launch.launcher import LaunchConfig
from goodput.launch.rendezvous import ERROR_FILE_ENV
from goodput.warm.record import record_folder, remove_folder, sweep_folders

if TYPE_CHECKING:
    from goodput.warm.agent import WarmAgent

__all__ = ["WarmConfig", "boot_args", "check_warm", "kill_group", "launch_warm", "worker_env"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmConfig:
    """How warm restarts behave.

    Args:
        spares: hot spare processes kept per node (0: a replacement is started cold and survivors wait).
        reform_timeout: seconds for a warm restart to re-form the group and recover before a cold restart.
        pg_timeout: seconds a collective may wait before it fails. A survivor blocked in a collective with a
            hung peer leaves it after this long, so keep it shorter than the script's ``Run(hang_timeout=)``:
            the hung rank's own watchdog then ends it and a spare takes its place.
        first_spare_delay: at most this many seconds from the start before the first spares are started (they
            start as soon as every worker has finished its first step; 0: at once, with the workers).
        shrink_after: when a rank fails and no spare is ready to take it within this many seconds, the
            survivors go on as a smaller group, and grow back when a spare is ready (None: never shrink; a
            replacement is waited for, as before).
        min_world: the fewest ranks the job shrinks to (with ``shrink_after``); below it a replacement is
            waited for.
    """

    spares: int = 1
    reform_timeout: float = 30.0
    pg_timeout: float = 30.0
    first_spare_delay: float = 120.0
    shrink_after: float | None = None
    min_world: int = 1

    def __post_init__(self) -> None:
        if self.spares < 0:
            raise ConfigError(f"--spares must be >= 0, got {self.spares}")
        for name, flag in (("reform_timeout", "--reform-timeout"), ("pg_timeout", "--collective-timeout")):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"{flag} (WarmConfig.{name}) must be > 0 seconds, got {value}")
        if self.shrink_after is not None and self.shrink_after < 0:
            raise ConfigError(f"--shrink-after must be >= 0 seconds, got {self.shrink_after}")
        if self.min_world < 1:
            raise ConfigError(f"--min-world must be >= 1, got {self.min_world}")


def check_warm(launch: LaunchConfig, warm: WarmConfig | None = None) -> None:
    """Refuse what warm restarts do not support, in one line.

    Raises:
        ConfigError: for an elastic node count (``--nnodes MIN:MAX``) without ``--shrink-after``, or a
            ``--min-world`` above the job's ranks.
    """
    if warm is None:
        return
    if warm.shrink_after is not None and warm.min_world > launch.max_world_size:
        raise ConfigError(
            f"--min-world {warm.min_world} is above --nproc x --nnodes ({launch.max_world_size}): pass at most "
            f"{launch.max_world_size}"
        )
    if not launch.nnodes.isdigit() and warm.shrink_after is None:
        raise ConfigError(
            f"--restart warm with an elastic --nnodes {launch.nnodes} needs --shrink-after SECONDS (the job "
            "shrinks when a node is lost and grows when one joins), or a fixed --nnodes N, or --restart cold"
        )


def launch_warm(launch: LaunchConfig, warm: WarmConfig) -> int:
    """Run ``launch``'s script under the warm-restart agent; returns the job's exit status.

    The agent runs as a child of ``goodput launch``'s supervisor, in torchrun's place, so a warm launch keeps
    every promise of a cold one: the launch folder, preemption with one agreed save (``EXIT_PREEMPTED``), the
    crash-loop and fatal-error verdicts (``EXIT_CRASH_LOOP``, ``EXIT_FATAL``) and no process left behind.
    """
    from goodput.launch.preflight import check_before_launch
    from goodput.launch.supervise import Supervisor

    check_warm(launch, warm)
    check_before_launch(launch)
    spec = json.dumps({"launch": dataclasses.asdict(launch), "warm": dataclasses.asdict(warm)})
    supervisor = Supervisor(launch, command=[sys.executable, "-m", "goodput.warm", spec])
    sweep_folders()
    try:
        return supervisor.run()
    finally:
        if supervisor.folder:  # the agent removes it, unless the launcher had to kill it first
            remove_folder(record_folder("", "", launch=os.path.basename(supervisor.folder)))


def worker_env(agent: WarmAgent, **extra: str) -> dict[str, str]:
    """The environment a worker or spare of ``agent`` starts with (``extra`` last): the run folder, torchrun's
    variables, the fault plan and crash-loop limit, and the warm protocol's store and timeouts."""
    launch, warm = agent.launch, agent.warm
    env = dict(os.environ)
    env.pop(ERROR_FILE_ENV, None)  # the agent's own error file; elastic gives each worker one of its own
    if launch.run_dir is not None:
        env[RUN_DIR.name] = os.path.abspath(launch.run_dir)
    env.update(
        TORCHELASTIC_RUN_ID=launch.rdzv_id,
        TORCHELASTIC_RESTART_COUNT=str(agent.cold_restarts),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=agent.address.rsplit(":", 1)[1],
        **{FAULTS.name: launch.faults, CRASH_LOOP.name: str(launch.crash_loop)},
        **{WARM_STORE.name: agent.address, WARM_PREFIX.name: agent.prefix},
        **{WARM_PG_TIMEOUT.name: str(warm.pg_timeout), WARM_REFORM_TIMEOUT.name: str(warm.reform_timeout)},
    )
    if agent.resize.on:  # the loader checks its global batch against every world size from this one up
        env[WARM_MIN_WORLD.name] = str(warm.min_world)
    if launch.allow_fresh_start:
        env[ALLOW_FRESH_START.name] = "1"  # read by CheckpointConfig.fresh_start_allowed
    if agent.nproc > 1:
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does for several processes per node
    env.update(extra)
    return env


def boot_args(script: tuple[str, ...]) -> tuple[str, ...]:
    """The script's command line behind ``-m goodput.warm.boot`` (its imports with the collector held back)."""
    return ("-m", "goodput.warm.boot", *script) if os.path.isfile(script[0]) else script


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (a worker and its data-loader processes)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
