"""The watchdog ends a hung process (a real one) and says so; steady beats keep it alive."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from goodput.errors import ConfigError
from goodput.job.codes import EXIT_HANG
from goodput.run.watchdog import Watchdog
from goodput.testing import S3Server
from goodput.testing.faultproxy import FaultProxy


def test_hung_process_is_ended_with_exit_hang(tmp_path: os.PathLike[str]) -> None:
    note = os.path.join(tmp_path, "hang.txt")
    code = (
        "import threading\n"
        "from goodput.run.watchdog import Watchdog\n"
        f"def on_hang(s, p):\n    open({note!r}, 'w').write(f'{{p}}')\n"
        "wd = Watchdog(0.3, phase_timeout=0.6, on_hang=on_hang)\n"
        "with wd.phase('checkpoint_save'):\n    threading.Event().wait()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_HANG
    assert "no progress for" in proc.stderr and "checkpoint_save" in proc.stderr
    # where it hung: every thread's stack, the main thread's wait among them
    assert "Current thread" in proc.stderr and 'File "<string>", line 7' in proc.stderr, proc.stderr
    with open(note) as f:
        assert f.read() == "checkpoint_save"


def test_beats_keep_a_busy_process_alive() -> None:
    exits: list[int] = []
    done = threading.Event()
    wd = Watchdog(0.5, exit=exits.append)
    # Beat far more often than the timeout for a while; the watchdog thread must not fire.
    for _ in range(200):
        wd.beat()
        done.wait(0.005)
    wd.close()
    assert exits == []


def test_a_phase_inside_a_phase_gives_the_outer_one_back() -> None:
    # each try of a final save is a phase inside the close's own: once a try ends, the close is still a phase,
    # judged by the phase's limit (0.3 s here), not a step's (60 s)
    hung: list[str | None] = []
    fired = threading.Event()
    wd = Watchdog(60.0, phase_timeout=0.3, on_hang=lambda s, p: hung.append(p), exit=lambda code: fired.set())
    with wd.phase("checkpoint_save"):
        with wd.phase("checkpoint_save"):
            pass
        assert fired.wait(10)  # a wait for the watchdog's verdict, not a synchronisation by time
    wd.close()
    assert hung == ["checkpoint_save"]


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="timeout"):
        Watchdog(0)


@pytest.mark.s3
def test_a_slow_store_at_the_start_is_given_the_restores_time_not_a_steps(
    s3_server: S3Server, s3_url: str, tmp_path: os.PathLike[str]
) -> None:
    # Making the checkpoint manager looks at the store (rank 0 checks the root): that look is part of restoring.
    code = (
        "import os, torch, goodput as gp\n"
        "config = gp.CheckpointConfig(root=os.environ['ROOT'], strategy='dcp')\n"
        "run = gp.Run(os.environ['RUN'], checkpoint=config, hang_timeout=3.0, progress=False)\n"
        "print('restored', run.restore(model=torch.nn.Linear(2, 2)))\n"
        "run.close()\n"
    )
    with FaultProxy(s3_server.s3_port) as proxy:
        proxy.stall_next(1, 6.0)  # the first request: past the 3 s hang timeout, inside the restore's 12 s
        env = {**os.environ, **s3_server.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url, "ROOT": s3_url,
               "RUN": os.path.join(tmp_path, "run")}  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
        assert proxy.injected() == {"stall": 1}
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "restored None" in proc.stdout


def test_a_collective_times_out_after_the_watchdog_so_a_hang_is_the_watchdog_s_to_report() -> None:
    from goodput.run.watchdog import COLLECTIVE_TIMEOUT, HANG_TIMEOUT, collective_timeout

    for hang in (1.0, 10.0, HANG_TIMEOUT, 3600.0):
        assert collective_timeout(hang) > hang  # the hung rank's watchdog speaks first, stacks and all
    assert collective_timeout(None) == COLLECTIVE_TIMEOUT
