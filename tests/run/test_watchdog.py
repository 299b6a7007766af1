"""The watchdog ends a hung process (a real one) and says so; steady beats keep it alive."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from goodput.errors import ConfigError
from goodput.run.watchdog import EXIT_HANG, Watchdog


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


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="timeout"):
        Watchdog(0)
