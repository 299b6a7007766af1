"""Exit codes: what a worker's status tells the launcher, and what the launcher's tells a scheduler.

The stops a restart cannot fix have codes of their own, from ``sysexits.h`` where one fits, so that a scheduler
script can requeue a preempted job and leave the others for a person (``docs/recipes/slurm/requeue.sh``).
"""

from __future__ import annotations

__all__ = [
    "EXIT_CRASH_LOOP",
    "EXIT_FATAL",
    "EXIT_HANG",
    "EXIT_NUMERIC",
    "EXIT_PREEMPTED",
    "EXIT_STRAGGLER",
    "EXIT_USAGE",
]

EXIT_USAGE = 2  # a user's mistake, on the command line or in a worker's configuration
EXIT_CRASH_LOOP = 3  # the attempts keep failing the same way (goodput.job.crashloop): a person must look
EXIT_HANG = 43  # a worker's own status: the hang watchdog ended it (goodput.run.watchdog); it is restarted
# EX_TEMPFAIL: requeue; the job was preempted after a durable save.
EXIT_PREEMPTED = 75
# EX_CONFIG: do not retry; a restart cannot fix a configuration or state-mismatch error.
EXIT_FATAL = 78
# EX_DATAERR: a numeric fault (NaN/Inf, loss spike, corrupted replica) survived rollback and skip, or came too
# often (goodput.run.numeric). Not requeued: the same data or the same hardware would fail again.
EXIT_NUMERIC = 65
# EX_UNAVAILABLE: a rank stayed slow and the straggler detector was asked to stop (goodput.run.stragglers).
# Not requeued as it is: reschedule the job away from the slow host.
EXIT_STRAGGLER = 69
