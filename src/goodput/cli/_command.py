"""One subcommand's parser, made the same way for every command of ``goodput``."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_command"]


def add_command(sub: Any, name: str, *, help: str, description: str | None, epilog: str | None = None) -> Any:
    """The parser of command ``name``; an ``epilog`` (examples, exit statuses) keeps its lines as written, so a
    command with one does not re-wrap its description either."""
    if epilog is None:
        return sub.add_parser(name, help=help, description=description)
    raw = argparse.RawDescriptionHelpFormatter
    return sub.add_parser(name, help=help, description=description, epilog=epilog, formatter_class=raw)
