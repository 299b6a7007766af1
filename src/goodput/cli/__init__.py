"""The ``goodput`` command line: one sub-module per command, each with ``register(subparsers)``.

Commands import their heavy dependencies (torch, matplotlib) inside their handlers so that
``goodput --help`` and ``goodput plan`` start fast.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
from collections.abc import Sequence

from goodput.errors import ConfigError, Stopped
from goodput.job.codes import EXIT_USAGE

__all__ = ["main"]

# Each name is a module goodput.cli.<name> exposing register(subparsers).
_COMMANDS = (
    "plan",
    "bench",
    "report",
    "data",
    "ls",
    "launch",
    "demo",
    "verify-resume",
    "verify-rollback",
    "drill",
)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit 2 (argparse prints the usage block too), and that
    reads a negative duration such as ``-30s`` as a value, so that its check can say what is wrong with it
    (argparse would take it for an option and say "expected one argument")."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._negative_number_matcher = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d*\.?\d+[A-Za-z]+$")

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def _check_value(self, action: argparse.Action, value: object) -> None:
        """A mistyped command or choice is refused with the nearest valid one (``goodput lanch``: launch)."""
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(choice) for choice in choices]
        near = difflib.get_close_matches(str(value), names, n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"choose from {', '.join(names)}"
        raise argparse.ArgumentError(action, f"invalid choice: {value!r}; {hint}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="goodput",
        description="Keep PyTorch training productive when hardware fails.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in _COMMANDS:
        importlib.import_module(f"goodput.cli.{name.replace('-', '_')}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.handler(args)
    except ConfigError as err:
        print(f"goodput {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except Stopped as stop:  # its launches have ended and its temporary folder is gone
        print(f"goodput {args.command}: {stop}", file=sys.stderr)
        return 128 + stop.signum
    except KeyboardInterrupt:
        print(f"goodput {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`goodput report RUN | head`): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
