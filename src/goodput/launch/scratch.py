"""The job's temporary folder: one per launch, removed when the launch ends, swept by the next one after a kill.

Processes write temporary folders they remove only when they exit cleanly: Python's multiprocessing (a DataLoader
worker pool's ``pymp-*``), torchrun's ``torchelastic_*``, the user's own ``tempfile`` calls. A rank that is
SIGKILLed, the normal end of a failure, leaves them in the machine's temporary folder for good, one more with every
failure. ``goodput launch`` therefore gives its job a folder of its own inside the temporary folder
(``TMPDIR`` for torchrun or the warm agent, and so for every worker), removes it once the job has ended, and a
launch that was itself SIGKILLed leaves it to the next launch on the machine, which removes it once its owner
record (:mod:`goodput.job.owner`) proves the killed launcher gone.

torch.compile's cache lives in the temporary folder by default (``torchinductor_<user>``); it is meant to outlive
a job, so ``TORCHINDUCTOR_CACHE_DIR`` keeps it where it was unless the user set it.

Unix sockets live in the temporary folder too (multiprocessing's ``pymp-*/listener-*``, which a DataLoader's
workers use to pass tensors), and a socket's path has a hard limit (107 bytes on Linux): a worker whose socket
cannot be bound hangs its loader. One more folder level must never cross it, so the job gets a folder of its own
only when that leaves :data:`SOCKET_ROOM` bytes for what goes inside; under a longer ``TMPDIR`` the job keeps the
user's, as it would without goodput.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import tempfile

from goodput.job.owner import record_owner, sweep_stale

__all__ = [
    "SOCKET_ROOM",
    "job_temp_env",
    "job_temp_path",
    "make_job_temp",
    "remove_job_temp",
    "scratch_prefix",
]

SOCKET_PATH_MAX = 107  # sun_path's 108 bytes, less the terminating NUL
# What goes inside the folder, with room to spare: multiprocessing's "/pymp-XXXXXXXX/listener-XXXXXXXX" is 32.
SOCKET_ROOM = 48


def scratch_prefix() -> str:
    """The name of every launch's folder up to its launch id (this user's only)."""
    return f"gp-{os.getuid()}-"


def job_temp_path(launch_id: str) -> str:
    """Where the launch's folder is, or would be, in this process's temporary folder."""
    return os.path.join(tempfile.gettempdir(), scratch_prefix() + launch_id)


def make_job_temp(launch_id: str) -> str:
    """Sweep the folders of launches that were killed, then make and claim this launch's; "" (no folder of its
    own) when its path would leave less than :data:`SOCKET_ROOM` bytes for the sockets inside it."""
    sweep_stale(tempfile.gettempdir(), scratch_prefix())
    folder = job_temp_path(launch_id)
    if len(os.fsencode(folder)) + SOCKET_ROOM > SOCKET_PATH_MAX:
        return ""
    os.makedirs(folder, mode=0o700)
    record_owner(folder)
    return folder


def job_temp_env(folder: str) -> dict[str, str]:
    """The variables that send the job's temporary files into ``folder`` and keep torch.compile's cache out (none
    without a folder)."""
    if not folder:
        return {}
    env = {"TMPDIR": folder}
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}"
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
            tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
        )
    return env


def remove_job_temp(folder: str) -> None:
    """Remove the job's folder and whatever its processes left in it."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
