"""Storage scenarios: ``storage-full`` (the checkpoint folder's file system runs out of space mid-save).

The drill moves the script's checkpoints (``$GOODPUT_CHECKPOINT_ROOT``) onto a tmpfs with room for one and a
half of the reference run's checkpoints: the first save fits, the next one runs out of space mid-way. When the
ledger records that failure the drill gives the file system room again (a remount, as an operator who adds
space), and the run must go on and commit its later saves. Mounting needs root (or CAP_SYS_ADMIN); without it
the scenario says so and fails, it does not pretend.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator

from goodput._env import CHECKPOINT_ROOT
from goodput.drill.runs import LaunchSpec, finish, result, start_launch
from goodput.drill.scenario import DrillContext, Scenario, ScenarioResult, register
from goodput.errors import ConfigError

__all__ = ["STORAGE_FULL"]

_ROOM = 64 << 20  # bytes of room the remount adds back
_PAGE = 4096  # a tmpfs allocates whole pages


def _checkpoint_bytes(run_dir: str) -> int:
    """What the reference run's largest checkpoint takes on disk: its folder's allocated blocks when it is a
    local folder (a tmpfs, too, gives each small file a whole page), else the bytes its ledger event names."""
    from goodput.ledger import read_events

    largest = 0
    for event in read_events(run_dir):
        if event["event"] != "checkpoint_durable":
            continue
        url = str(event.get("url") or "")
        size = int(event.get("bytes") or 0)
        if os.path.isdir(url):
            size = _PAGE + sum(
                _PAGE + os.stat(os.path.join(folder, name)).st_blocks * 512
                for folder, _, names in os.walk(url)
                for name in names
            )
        largest = max(largest, size)
    return largest


@contextlib.contextmanager
def _tmpfs(path: str, size: int) -> Iterator[None]:
    """A tmpfs of ``size`` bytes mounted at ``path`` for the scenario's duration."""
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise ConfigError(f"cannot mount a tmpfs at {path} (root is needed): {done.stderr.strip()}")
    try:
        yield
    finally:
        if subprocess.run(["umount", path], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", path], capture_output=True)


def _failed_saves(run_dir: str) -> list[int]:
    """The steps whose save the ledger records as failed (any rank)."""
    from goodput.ledger import read_events

    try:
        events = read_events(run_dir, rank=None)
    except (ConfigError, FileNotFoundError):
        return []
    return sorted({int(e["step"]) for e in events if e["event"] == "checkpoint_failed"})


def _durable_after(run_dir: str, step: int) -> list[int]:
    from goodput.ledger import read_events

    events = read_events(run_dir, rank=None)
    return sorted({int(e["step"]) for e in events if e["event"] == "checkpoint_durable" and e["step"] > step})


def _trained_on(run_dir: str, step: int) -> bool:
    """Whether rank 0 trained past ``step`` in the attempt whose save of ``step`` failed (no restart)."""
    from goodput.ledger import read_events

    events = read_events(run_dir, rank=0)
    attempts = {int(e["attempt"]) for e in events if e["event"] == "checkpoint_failed" and e["step"] == step}
    return any(
        e["event"] == "step_end" and int(e["attempt"]) in attempts and int(e["step"]) > step for e in events
    )


def _storage_full(context: DrillContext) -> ScenarioResult:
    ref = context.reference
    size = _checkpoint_bytes(ref.run_dir)
    run_dir = os.path.join(context.work_dir, "run")
    disk = os.path.join(context.work_dir, "disk")
    if not size or len(ref.saves) < 3:
        return result(
            context, ref.run_dir, injected="nothing", status=1, seconds=0.0,
            problems=[f"the script must save at least 3 times (saved {list(ref.saves)})"],
        )  # fmt: skip
    limit = size * 3 // 2
    try:
        with _tmpfs(disk, limit):
            context.say(f"storage-full: checkpoints on a {limit >> 10} KiB tmpfs (one: {size >> 10} KiB)")
            started = time.monotonic()
            proc = start_launch(context, run_dir, LaunchSpec(restarts=3, env={CHECKPOINT_ROOT.name: disk}))
            failed: list[int] = []
            while proc.poll() is None and not failed:
                failed = _failed_saves(run_dir)
                time.sleep(0.05)  # polling the ledger for the failure, not a synchronisation by time
            failed = failed or _failed_saves(run_dir)
            subprocess.run(["mount", "-o", f"remount,size={limit + _ROOM}", disk], check=True)
            context.say(f"storage-full: the save of step {failed[0] if failed else '?'} failed; room again")
            done = finish(proc, started)
    except ConfigError as err:
        return result(context, run_dir, injected="nothing", status=1, seconds=0.0, problems=[str(err)])
    failed = _failed_saves(run_dir) or failed  # every failed save, also those after the first
    problems = []
    if not failed:
        problems.append("no save failed: the checkpoints fit on the small file system")
    elif not _trained_on(run_dir, failed[0]):
        problems.append(f"training did not go on past the failed save of step {failed[0]} in its attempt")
    elif not _durable_after(run_dir, failed[0]):
        problems.append(f"no save became durable after the failed save of step {failed[0]}")
    injected = f"checkpoint folder full ({limit >> 10} KiB): saves of steps {failed} failed, then room again"
    return result(
        context, run_dir, injected=injected, status=done.status, seconds=done.seconds, problems=problems
    )


STORAGE_FULL = register(
    Scenario(
        name="storage-full",
        injects="the checkpoint folder's file system runs out of space mid-save, then has room again",
        outcome="completed; the failed save is one warning and a checkpoint_failed ledger event, the previous "
        "checkpoint stays valid and training goes on; a later save commits once there is room; every "
        "sample once; final state identical",
        run=_storage_full,
    )
)
