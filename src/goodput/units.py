"""Durations and sizes written by people: ``30m``, ``2h``, ``90s``, ``512MiB``.

Pure parsing, shared by the command line and the config dataclasses.
"""

from __future__ import annotations

import re

from goodput.errors import ConfigError

__all__ = ["format_duration", "parse_bytes", "parse_duration"]

_SECONDS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_BYTES = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]+)\s*$")


def parse_duration(text: str, *, what: str = "duration") -> float:
    """Seconds in a duration such as ``30m``, ``2h``, ``1.5d``, ``90s`` or ``250ms``.

    Raises:
        ConfigError: when the text has no unit, an unknown unit, or a negative value.
    """
    match = _NUMBER_UNIT.match(text)
    if match is None or match.group(2).lower() not in _SECONDS:
        raise ConfigError(f"{what} {text!r} needs a number and a unit (ms, s, m, h, d), e.g. '30m' or '2h'")
    return float(match.group(1)) * _SECONDS[match.group(2).lower()]


def parse_bytes(text: str, *, what: str = "size") -> int:
    """Bytes in a size such as ``512MiB``, ``2GB`` or ``4096B``.

    Raises:
        ConfigError: when the text has no unit or an unknown unit.
    """
    match = _NUMBER_UNIT.match(text)
    if match is None or match.group(2).lower() not in _BYTES:
        raise ConfigError(
            f"{what} {text!r} needs a number and a unit (B, KiB, MiB, GiB, MB, GB), e.g. '512MiB'"
        )
    return int(float(match.group(1)) * _BYTES[match.group(2).lower()])


def format_duration(seconds: float) -> str:
    """A short human reading of a duration: ``45s``, ``24.5m``, ``2.0h``, ``3.1d``."""
    if seconds < 120:
        return f"{seconds:.3g}s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
