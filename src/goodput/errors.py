"""Every exception goodput raises on purpose.

The tree::

    GoodputError                      base of everything below
    ├── ConfigError (ValueError)      a user's mistake in arguments, flags or configuration
    ├── CheckpointError               a checkpoint could not be saved or restored
    │   ├── CheckpointCorrupt         a checkpoint failed verification (names the file and the reason)
    │   ├── StateMismatch (ValueError) a checkpoint does not fit the model/optimizer/loader it is loaded into
    │   ├── NoValidCheckpoint         committed checkpoints exist and none loads; a fresh start needs consent
    │   └── SaveFailed                a save failed; the previous checkpoint is untouched
    ├── DataError                     the data pipeline cannot go on
    │   └── FingerprintMismatch (ValueError) the dataset differs from the one the position was saved with
    ├── StorageError                  remote storage failed after every retry (names the URL and last cause)
    │   └── AccessRefused (ConfigError) the store refused the credentials or the permission: no restart
    │                                 fixes it (names the URL and where credentials are read from)
    ├── ProtocolMismatch              a warm store key holds a payload of another format (a process of the job
    │                                 runs another goodput version, or something else wrote the key)
    ├── CrashLoop                     attempts keep failing (no progress, or the same error): restarting is pointless
    ├── NumericFault                  a NaN/Inf, loss spike or corrupted replica survived the rollback ladder
    ├── StragglerStop                 a rank stayed slow and the straggler detector was asked to stop the job
    └── Stopped                       SIGTERM or SIGINT stopped a command that runs a script several times (drill,
                                      verify-*) once its launches ended; the command line exits 128 + the signal

A ``ConfigError`` (``AccessRefused`` included) reaching the command line prints one line and exits with code 2;
inside a run under ``goodput launch`` it stops the job at once with ``EXIT_FATAL`` (78), as do the other errors
a restart cannot fix (``StateMismatch``, ``FingerprintMismatch``, ``NoValidCheckpoint``; see
``goodput.job.folder``).
"""

from __future__ import annotations

import signal

__all__ = [
    "AccessRefused",
    "CheckpointCorrupt",
    "CheckpointError",
    "ConfigError",
    "CrashLoop",
    "DataError",
    "FingerprintMismatch",
    "GoodputError",
    "NoValidCheckpoint",
    "NumericFault",
    "ProtocolMismatch",
    "SaveFailed",
    "StateMismatch",
    "Stopped",
    "StorageError",
    "StragglerStop",
]


class GoodputError(Exception):
    """Base class of goodput's own exceptions."""


class ConfigError(GoodputError, ValueError):
    """A user's mistake: a bad argument, flag or configuration value."""


def check_at_least(what: str, value: float, least: float) -> None:
    """Raise ``ConfigError("WHAT must be >= LEAST, got VALUE")`` when ``value`` is below ``least``."""
    if value < least:
        raise ConfigError(f"{what} must be >= {least}, got {value}")


class CheckpointError(GoodputError):
    """A checkpoint could not be saved or restored."""


class CheckpointCorrupt(CheckpointError):
    """A checkpoint failed verification."""


class StateMismatch(CheckpointError, ValueError):
    """A checkpoint does not fit what it is being loaded into."""


class NoValidCheckpoint(CheckpointError):
    """Committed checkpoints exist and none of them could be loaded.

    Starting from step 0 beside them would silently throw their training away, and every restart would find
    them damaged again, so the run stops unless a fresh start is allowed (``CheckpointConfig.allow_fresh_start``,
    ``goodput launch --allow-fresh-start``).
    """


class SaveFailed(CheckpointError):
    """A save failed; the previous committed checkpoint is untouched.

    Attributes:
        step: the step whose save failed (None when unknown).
        reason: what failed, as the ranks reported it (None when unknown).
    """

    def __init__(self, message: str, *, step: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.reason = reason


class DataError(GoodputError):
    """The data pipeline cannot go on."""


class FingerprintMismatch(DataError, ValueError):
    """The dataset differs from the one a data position was saved with."""


class StorageError(GoodputError):
    """Remote storage failed after every retry."""


class AccessRefused(StorageError, ConfigError):
    """The store refused access: no credentials found, a wrong key or signature, or no permission (401/403).

    Every retry and every restarted attempt fails the same way, so it is a configuration error: the message
    names the URL and where credentials are read from, never a secret.
    """


class ProtocolMismatch(GoodputError):
    """A key of the warm-restart store holds a payload goodput does not read (``goodput.warm.protocol``): written
    by another goodput version, or by something that is not goodput. The message names the key and what it held.
    """


class CrashLoop(GoodputError):
    """Consecutive attempts made no progress past their restored step, or failed with the same error in the
    same step."""


class StragglerStop(GoodputError):
    """A rank stayed slow and ``StragglerConfig(stop=True)`` stops the job (exit ``EXIT_STRAGGLER``, no requeue).

    The message is one line: the rank, its host, compute or data, and its score.
    """


class NumericFault(GoodputError):
    """A numeric fault survived every rung of the ladder (rollback, skip) or came too often: the run stops.

    The message is one line: the step, the rank, the value seen and what was tried.
    """


class Stopped(GoodputError):
    """SIGTERM or SIGINT stopped a drill or a verify (``goodput.verify.session``): its launches have ended.

    Attributes:
        signum: the first signal that came.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")
