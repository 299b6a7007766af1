"""The options of the commands that run a user's training script (verify-resume, verify-rollback, drill,
launch): the script and its arguments after ``--``, and where the verifying commands put their runs (internal):
a temporary folder, removed when the command ends unless ``--keep`` (``goodput.verify.session``)."""

from __future__ import annotations

import argparse

__all__ = ["add_ranks_and_steps", "add_work_dir_and_script", "script_of"]


def add_ranks_and_steps(parser: argparse.ArgumentParser, *, training: str, steps: int) -> None:
    """``--nproc`` (2 ranks) and ``--steps`` of the built-in ``training`` (``steps`` unless given), the first
    options of a command that verifies a run against another."""
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--steps", type=int, default=None, help=f"{training}: steps (default {steps})")


def add_work_dir_and_script(parser: argparse.ArgumentParser, *, runs: str) -> None:
    """``--work-dir`` (where ``runs`` go), ``--keep`` and the optional script after ``--``, the last options of a
    command that checks the built-in training or the user's script."""
    parser.add_argument(
        "--work-dir", default=None, help=f"where {runs} go, kept afterwards (default: a temporary folder)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the temporary folder (default: removed at the end)"
    )
    parser.add_argument(
        "script",
        nargs=argparse.REMAINDER,
        metavar="-- train.py args",
        help="your training script and its arguments (optional)",
    )


def script_of(args: argparse.Namespace) -> list[str]:
    """The script and its arguments, without the ``--`` that separates them from the command's options."""
    script: list[str] = args.script
    return script[1:] if script[:1] == ["--"] else script
