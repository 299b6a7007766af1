"""``goodput verify-rollback [-- train.py args]``: the numeric guard's rollbacks and skips, checked bit for bit
against a run that skipped the same samples from the start. Without a script it checks the demo's training."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from goodput.cli._command import add_command
from goodput.cli._script import add_ranks_and_steps, add_work_dir_and_script, script_of

__all__ = ["register"]

_EPILOG = """three runs under 'goodput launch', the numeric guard on in each (GOODPUT_NUMERIC=1 turns it on at its
defaults where the script leaves it off; a NumericConfig of the script's own is kept): a clean one (its length
places the drill; it must raise no alarm), one with the drill (a NaN loss that comes back on its redo, so it is
rolled back twice and its data window skipped; a 20x loss spike; with 2+ ranks a flipped bit on rank 0 at a
replica check), and one that starts with the drilled run's skip list (RUN_DIR/numeric/skips.json) and no fault.
The last two are compared as verify-resume compares them (GOODPUT_RECORDS=1: every step's samples, loss and
random generators as last trained, and the final state). The script must be deterministic (see
goodput verify-resume --help) and checkpoint often enough that a rollback has a checkpoint before each fault.
  goodput verify-rollback                          # the demo's training, 150 steps
  goodput verify-rollback --nproc 2 -- train.py

exit status: 0 identical and every fault found, 1 different or a run failed, 2 bad arguments,
128 + N stopped by signal N (the run in progress stops as goodput launch stops; the temporary folder goes)."""


_HELP = "prove that the numeric guard's rollbacks and skips end as a run that skipped the data from the start"


def register(sub: Any) -> None:
    parser = add_command(sub, "verify-rollback", help=_HELP, description=__doc__, epilog=_EPILOG)
    add_ranks_and_steps(parser, training="the demo's training", steps=150)
    add_work_dir_and_script(parser, runs="the runs")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from goodput.errors import ConfigError
    from goodput.verify.session import in_work_folder

    script = script_of(args)
    if script and args.steps is not None:
        raise ConfigError("--steps applies to the demo's training only; your script sets its own")

    def say(line: str) -> None:
        print(f"goodput verify-rollback: {line}", file=sys.stderr)

    return in_work_folder(
        lambda work: _verify(args, script, work), args.work_dir, prefix="goodput-verify-rollback-",
        keep=args.keep, say=say,
    )  # fmt: skip


def _verify(args: argparse.Namespace, script: list[str], work: str) -> int:
    from goodput.errors import ConfigError
    from goodput.verify.rollback import verify_rollback

    if not script:
        from goodput.demo.main import TRAIN_SCRIPT
        from goodput.demo.verify_train import prepare_data

        steps = 150 if args.steps is None else args.steps
        if steps < 20:
            raise ConfigError(f"--steps must be >= 20 (the spike rule's warm-up), got {steps}")
        os.makedirs(work, exist_ok=True)
        script = [
            TRAIN_SCRIPT, f"--data={prepare_data(work)}", f"--steps={steps}", "--every=10", "--memory-every=2",
            f"--memory-folder={os.path.join(work, 'ram')}", "--no-progress", "--numeric",
        ]  # fmt: skip
    return verify_rollback(script, nproc=args.nproc, work_dir=work, say=print)
