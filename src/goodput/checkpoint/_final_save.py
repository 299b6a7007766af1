"""The final save: the one save a run cannot end without, tried again for a while when the store refuses it.

A periodic save that fails is skipped: training goes on and the next save tries again. The final save (the
run's last step, at ``close``) has no next one: failing it ends the attempt, and a restart redoes the steps
since the last checkpoint only to meet the same store at the same step. A store that refuses writes (out of
space, throttling past its clients' own retries) is often back within minutes, so the manager tries the final
save again with backoff for at most ``$GOODPUT_FINAL_SAVE_TIMEOUT`` seconds before it fails as any save does.
Every rank tries again or gives up on rank 0's word, so no rank waits in a collective another one has left.

Pure: the bound, the pauses and the two lines a user reads; the manager owns the clock and the loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from goodput._env import FINAL_SAVE_TIMEOUT
from goodput._storage_errors import redact_url, scrub, secret_values
from goodput.errors import ConfigError, SaveFailed

__all__ = ["FIRST_PAUSE", "LONGEST_PAUSE", "final_save_timeout", "gave_up", "pause_before", "trying_again"]

FIRST_PAUSE = 1.0  # seconds before the first try again; each later pause doubles ...
LONGEST_PAUSE = 30.0  # ... up to this: inside the watchdog's limit for a save even at a short hang timeout
_REASON_CHARS = 400  # a reason longer than this (many ranks' errors) is cut in the lines below


def final_save_timeout(environ: Mapping[str, str] | None = None) -> float:
    """``$GOODPUT_FINAL_SAVE_TIMEOUT`` in seconds.

    Raises:
        ConfigError: it is not a finite number of seconds >= 0.
    """
    text = FINAL_SAVE_TIMEOUT.get(environ).strip()
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0.0 <= seconds < math.inf:
        raise ConfigError(f"{FINAL_SAVE_TIMEOUT.name} must be a number of seconds >= 0, got {text!r}")
    return seconds


def pause_before(tries: int, left: float) -> float | None:
    """The pause after ``tries`` failed tries with ``left`` seconds of the bound left; None: give up."""
    if left <= 0.0:
        return None
    return min(FIRST_PAUSE * 2.0 ** min(tries - 1, 16), LONGEST_PAUSE, left)


def _failed(step: int, root: str, options: Mapping[str, Any], failed: SaveFailed) -> str:
    """Both lines' start: the step, the store's URL and the error, without credentials."""
    reason = scrub(failed.reason or str(failed), secret_values(options))
    reason = reason if len(reason) <= _REASON_CHARS else reason[:_REASON_CHARS] + "..."
    return f"the final save of step {step} to {redact_url(root)} failed: {reason}"


def trying_again(
    step: int, root: str, options: Mapping[str, Any], failed: SaveFailed, pause: float, left: float
) -> str:
    """The line for one try again: the step, the store, the error, the pause and the bound left."""
    return (
        f"{_failed(step, root, options, failed)}; trying again in {pause:.1f}s (for up to {left:.0f}s more: "
        f"{FINAL_SAVE_TIMEOUT.name})"
    )


def gave_up(
    step: int, root: str, options: Mapping[str, Any], failed: SaveFailed, tries: int, newest: int | None
) -> str:
    """The line when the bound is spent: what failed, how often, and the checkpoint a restart resumes from."""
    previous = "none" if newest is None else f"step {newest}"
    return (
        f"{_failed(step, root, options, failed)} ({tries} {'try' if tries == 1 else 'tries'} in all); the "
        f"previous checkpoint ({previous}) is untouched; {FINAL_SAVE_TIMEOUT.name} sets how long the final save tries again"
    )
