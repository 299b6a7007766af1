"""Every ``GOODPUT_*`` environment variable, in one table: its meaning, its default and who sets it.

Variables carry what must reach every process of a job unchanged (torchrun's workers, the warm agent's spares,
a benchmark's children) without a flag on the user's script. Code reads them through the :class:`EnvVar`
objects here, never by name, so this table is complete by construction; ``docs/environment.md`` lists the same
rows (``tests/test_env.py`` keeps the page and the table equal).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

__all__ = ["VARIABLES", "EnvVar"]


@dataclasses.dataclass(frozen=True)
class EnvVar:
    """One variable: ``set_by`` is ``user`` (a knob for people), or ``goodput`` (set by one goodput process
    for another: documented so that a user recognises it, not meant to be set by hand)."""

    name: str
    meaning: str
    default: str
    set_by: str

    def get(self, environ: Mapping[str, str] | None = None) -> str:
        """The value, or the default when unset."""
        return (os.environ if environ is None else environ).get(self.name, self.default)

    def on(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether a flag variable is set to a true value (anything but empty or ``0``)."""
        return self.get(environ) not in ("", "0")


RUN_DIR = EnvVar(
    "GOODPUT_RUN_DIR", "the run folder, when Run() or an integration gets none", "", "user, goodput launch"
)
FAULTS = EnvVar("GOODPUT_FAULTS", "a fault plan to drill (see goodput.faults)", "", "user, goodput launch")
CRASH_LOOP = EnvVar(
    "GOODPUT_CRASH_LOOP",
    "attempts without progress (or with the same error in the same step) that stop the job as a crash loop",
    "3",
    "user, goodput launch",
)
FINAL_SAVE_TIMEOUT = EnvVar(
    "GOODPUT_FINAL_SAVE_TIMEOUT",
    "seconds the final save (run.close(), a manager's close(step=)) tries again, with backoff, while the store "
    "refuses it, before it fails (0: at once)",
    "300",
    "user",
)
PREEMPT_SIGNAL = EnvVar(
    "GOODPUT_PREEMPT_SIGNAL",
    "the signal that asks every rank to save and stop",
    "USR1",
    "user, goodput launch",
)
ALLOW_FRESH_START = EnvVar(
    "GOODPUT_ALLOW_FRESH_START",
    "1: start from scratch when no checkpoint of the run can be restored",
    "",
    "user, goodput launch --allow-fresh-start",
)
CHECKPOINT_ROOT = EnvVar(
    "GOODPUT_CHECKPOINT_ROOT",
    "where Run saves checkpoints instead of its configured root (the store's endpoint and credentials then "
    "come from the environment)",
    "",
    "goodput drill",
)
RECORDS = EnvVar(
    "GOODPUT_RECORDS",
    "1: Run records each step's samples, loss and RNG for verify-resume",
    "",
    "goodput verify-resume",
)
STOP_AFTER = EnvVar(
    "GOODPUT_STOP_AFTER",
    "a step: Run closes (saving that step) and the process exits 0 after it; verify-resume's reference runs",
    "",
    "goodput verify-resume",
)
NUMERIC = EnvVar(
    "GOODPUT_NUMERIC",
    "1: Run turns the numeric guard on at its defaults where the script leaves it off",
    "",
    "goodput verify-rollback",
)
LAUNCH_DIR = EnvVar("GOODPUT_LAUNCH_DIR", "this launch's folder (markers, logs)", "", "goodput launch")
LAUNCH_ID = EnvVar(
    "GOODPUT_LAUNCH_ID", "this launch's id, in crash-loop records and the ledger", "", "goodput launch"
)
RESERVED_WORLD = EnvVar(
    "GOODPUT_RESERVED_WORLD",
    "the ranks the job reserved (nproc x max nnodes; unset: WORLD_SIZE), capacity goodput's denominator",
    "",
    "goodput launch",
)
LAUNCHER_PID = EnvVar(
    "GOODPUT_LAUNCHER_PID", "the launcher's process id, whose end ends every worker", "", "goodput launch"
)
MOSAIC_PYTHON = EnvVar(
    "GOODPUT_MOSAIC_PYTHON",
    "the python of the venv with mosaicml-streaming, for goodput bench cache's comparison",
    ".venv-mosaic/bin/python",
    "user",
)
BENCH_S3_OPTIONS = EnvVar(
    "GOODPUT_BENCH_S3_OPTIONS",
    "the benchmark server's storage options, kept out of argv",
    "",
    "goodput bench",
)
TESTING_BREAK_MESH = EnvVar(
    "GOODPUT_TESTING_BREAK_MESH_ONCE",
    "a file: while it exists, rank 0 of a goodput.testing.run_ranks call fails to form the group (and removes it)",
    "",
    "the test suite",
)


def _warm(name: str, meaning: str, default: str = "") -> EnvVar:
    """A variable the warm agent sets for its workers and spares."""
    return EnvVar(name, meaning, default, "goodput launch --restart warm")


WARM_STORE = _warm("GOODPUT_WARM_STORE", "the warm agent's TCP store (host:port)")
WARM_PREFIX = _warm("GOODPUT_WARM_PREFIX", "this job's key prefix in the shared store")
WARM_ROLE = _warm("GOODPUT_WARM_ROLE", "worker or spare")
WARM_GEN = _warm("GOODPUT_WARM_GEN", "the generation a worker joins")
WARM_STARTED = _warm(
    "GOODPUT_WARM_STARTED",
    "wall time the agent started a worker: its attempt's begin (a forked one began sooner)",
)
WARM_SPARE_ID = _warm("GOODPUT_WARM_SPARE_ID", "a spare's id (node-index)")
WARM_PG_TIMEOUT = _warm("GOODPUT_WARM_PG_TIMEOUT", "seconds a generation's collectives wait", "60")
WARM_REFORM_TIMEOUT = _warm(
    "GOODPUT_WARM_REFORM_TIMEOUT", "seconds a survivor waits for the next generation", "60"
)
WARM_MIN_WORLD = EnvVar(
    "GOODPUT_WARM_MIN_WORLD",
    "the fewest ranks a warm job may shrink to (set only with --shrink-after)",
    "",
    "goodput launch --restart warm --shrink-after",
)

VARIABLES: tuple[EnvVar, ...] = (
    RUN_DIR,
    FAULTS,
    CRASH_LOOP,
    FINAL_SAVE_TIMEOUT,
    PREEMPT_SIGNAL,
    ALLOW_FRESH_START,
    CHECKPOINT_ROOT,
    RECORDS,
    STOP_AFTER,
    NUMERIC,
    LAUNCH_DIR,
    LAUNCH_ID,
    RESERVED_WORLD,
    LAUNCHER_PID,
    MOSAIC_PYTHON,
    BENCH_S3_OPTIONS,
    TESTING_BREAK_MESH,
    WARM_STORE,
    WARM_PREFIX,
    WARM_ROLE,
    WARM_GEN,
    WARM_STARTED,
    WARM_SPARE_ID,
    WARM_PG_TIMEOUT,
    WARM_REFORM_TIMEOUT,
    WARM_MIN_WORLD,
)
