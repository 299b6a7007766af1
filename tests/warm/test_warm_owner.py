"""The sweep of warm jobs' RAM folders: only a folder whose recorded owner provably ended is removed.

The owner that ends is a real process, SIGKILLed; the other cases (a live owner, a reused pid, a folder goodput
did not write, another pid namespace, another user's name) must stay.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from goodput.job.owner import record_owner, sweep_stale

PREFIX = "goodput-warm-test-"
_OWN = "import os, sys; from goodput.job.owner import record_owner; record_owner(sys.argv[1]); print('ok')"


def _folder(base: str, name: str, owner: dict[str, object] | None = None) -> str:
    path = os.path.join(base, name)
    os.makedirs(path)
    with open(os.path.join(path, "rank-0.0"), "wb") as f:
        f.write(b"record")
    if owner is not None:
        with open(os.path.join(path, f"owner-{owner['pid']}"), "w") as f:
            json.dump(owner, f)
    return path


def _own_record(folder: str) -> dict[str, object]:
    (name,) = [n for n in os.listdir(folder) if n.startswith("owner-")]
    with open(os.path.join(folder, name)) as f:
        record: dict[str, object] = json.load(f)
    return record


def test_only_folders_whose_owner_provably_ended_are_swept(tmp_path: os.PathLike[str]) -> None:
    base = str(tmp_path)
    dead = _folder(base, PREFIX + "dead")
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWN + "; sys.stdout.flush(); sys.stdin.read()", dead],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert owner.stdout is not None and owner.stdout.readline().strip() == "ok"
    assert sweep_stale(base, PREFIX) == []  # its owner runs: kept
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(timeout=30)

    alive = _folder(base, PREFIX + "alive")
    record_owner(alive)  # this process
    mine = _own_record(alive)
    reused = _folder(base, PREFIX + "reused", {**mine, "start": "1"})  # our pid, but not our start: ended
    foreign = _folder(base, PREFIX + "foreign")  # no owner record: nothing proves it goodput's
    torn = _folder(base, PREFIX + "torn")
    with open(os.path.join(torn, "owner-1"), "w") as f:
        f.write('{"pid": 1, "sta')
    elsewhere = _folder(base, PREFIX + "ns", {**mine, "start": "1", "pidns": "pid:[1]"})  # another namespace
    both = _folder(base, PREFIX + "both", {**mine, "start": "1"})
    record_owner(both)  # a second owner still runs
    other = _folder(base, "goodput-warm-someone-else", {**mine, "start": "1"})

    assert sorted(sweep_stale(base, PREFIX)) == sorted([dead, reused])
    for kept in (alive, foreign, torn, elsewhere, both, other):
        assert os.path.isdir(kept), kept
    assert not os.path.exists(dead) and not os.path.exists(reused)
