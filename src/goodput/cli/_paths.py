"""Checks of output paths given on the command line, before any work is done (internal)."""

from __future__ import annotations

import os

from goodput.errors import ConfigError

PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def check_output_file(path: str, flag: str) -> None:
    """Refuse, with one line, a plot file whose folder does not exist or whose suffix matplotlib cannot write."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"{flag} {path!r}: folder {folder!r} does not exist; create it first")
    if os.path.splitext(path)[1].lower() not in PLOT_SUFFIXES:
        raise ConfigError(f"{flag} {path!r}: give a .png, .pdf or .svg file name")


def check_run_folder(path: str, flag: str) -> None:
    """Refuse, with one line, a run folder that exists but is not a folder (it is created when missing)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{flag} {path!r} is a file, not a folder: give a run folder (created if missing)")
