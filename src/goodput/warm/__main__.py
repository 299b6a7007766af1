"""The warm-restart agent's process: ``python -m goodput.warm SPEC``, started by ``launch_warm``.

SPEC is the JSON of the launch's ``LaunchConfig`` and ``WarmConfig``. The process runs where torchrun runs in a
cold launch, under ``goodput launch``'s supervisor, and exits with the job's status.
"""

from __future__ import annotations

import json
import signal
import sys

from goodput.job.signals import parse_signal
from goodput.launch.launcher import LaunchConfig
from goodput.warm.agent import WarmAgent, WarmConfig
from goodput.warm.boot import hold, release


def main(argv: list[str]) -> int:
    """Run the agent for the launch in ``argv[0]``; returns the job's exit status."""
    spec = json.loads(argv[0])
    launch = LaunchConfig(**{**spec["launch"], "script": tuple(spec["launch"]["script"])})
    # The preemption signal is the workers' business (the launcher forwards it to them); one sent to every
    # process of the job must not end the agent. A handler, unlike SIG_IGN, is not inherited by the workers.
    signal.signal(parse_signal(launch.preempt_signal), lambda signum, frame: None)
    hold()  # the agent imports torch before it starts the workers: with the collector held back (_gcboot)
    from torch.distributed.elastic.multiprocessing.errors import record

    # torch's @record, as on torchrun's main: an uncaught error (the rendezvous's, when a node cannot join or
    # loses the store's host) goes to $TORCHELASTIC_ERROR_FILE, where the launcher reads its verdict.
    status = record(_run)(launch, WarmConfig(**spec["warm"]))
    assert status is not None  # the decorator passes _run's value through (typed as optional)
    return status


def _run(launch: LaunchConfig, warm: WarmConfig) -> int:
    agent = WarmAgent(launch, warm)
    release()
    return agent.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
