"""What ``goodput launch`` checks before it starts anything: each mistake is one line and exit 2, nothing runs.

* the script: a file python can run (or a folder with ``__main__.py``), or ``-m module`` whose top-level package
  can be found from the current folder;
* the run folder: ``--run-dir`` (or ``$GOODPUT_RUN_DIR``) is required, as there is no safe default: a new folder
  at every launch would start afresh when the user relaunches to resume, and one folder per script name would
  resume another experiment's checkpoints. It must be a folder this user can create and write.

The checkpoint root is the script's own (``CheckpointConfig(root=...)``; by default ``RUN_DIR/checkpoints``, which
the run-folder check covers): the launcher cannot know a root the script chooses. A remote root is checked by
rank 0 at the start of the first attempt (the ``CheckpointManager`` writes and removes a probe object there), and
credentials the store refuses stop the job at that point with one line and ``EXIT_FATAL``.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

from goodput._env import RUN_DIR
from goodput.errors import ConfigError
from goodput.launch.launcher import LaunchConfig

__all__ = ["check_before_launch"]

RUN_DIR_ENV = RUN_DIR.name


def check_before_launch(config: LaunchConfig) -> None:
    """Refuse a launch that cannot work, before torchrun starts.

    Raises:
        ConfigError: the script or module is missing, or the run folder is missing, not a folder or not
            writable.
    """
    _check_script(config.script)
    _check_run_dir(config.run_dir, config.script)


def _check_script(script: tuple[str, ...]) -> None:
    first = script[0]
    if first in ("-m", "--module"):
        if len(script) < 2:
            raise ConfigError("launch -- -m needs a module name, e.g. goodput launch -- -m mypkg.train")
        top = script[1].split(".", 1)[0]
        # Found without importing it (the workers run it from this folder: `python -m` puts it first on the path).
        if importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path]) is None:
            raise ConfigError(
                f"module {script[1]!r} not found: no package {top!r} in {os.getcwd()} or on sys.path"
            )
        return
    if first.startswith("-"):
        raise ConfigError(f"launch takes the script after '--', got the option {first!r} there")
    if os.path.isfile(first) or os.path.isfile(os.path.join(first, "__main__.py")):
        return
    where = os.path.abspath(first)
    raise ConfigError(f"the training script {first!r} does not exist ({where})")


def _check_run_dir(run_dir: str | None, script: tuple[str, ...]) -> None:
    if run_dir is None:
        module = script[0] in ("-m", "--module") and len(script) > 1
        stem = script[1].rsplit(".", 1)[-1] if module else os.path.splitext(os.path.basename(script[0]))[0]
        raise ConfigError(
            f"launch needs --run-dir (or ${RUN_DIR_ENV}): the run's folder of checkpoints, ledger and launch "
            f"history; launching again with the same folder resumes the run, e.g. --run-dir runs/{stem}"
        )
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--run-dir {run_dir!r} cannot be created: {err.strerror or err}") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"--run-dir {run_dir!r} is not writable by this user: choose another folder")
