"""A warm restart of a user's script that builds its dataset (shards on S3 through a small cache) inside
``train(run)``: the survivor's new generation starts with nothing of the failed one still running."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from goodput.data import write_shards
from goodput.testing import S3Server
from tests.helpers.launching import warm_launch

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "warm_cache_train.py")
SAMPLES, FEATURES = 128, 8


def _write_data(server: S3Server, url: str) -> int:
    """SAMPLES float samples as shards of 8 at ``url``; returns the data's bytes."""
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((SAMPLES, FEATURES + 1), dtype=np.float32)
    index = write_shards(
        (row.tobytes() for row in rows),
        url,
        shard_bytes=8 * rows[0].nbytes,
        storage_options=server.storage_options(),
    )
    return sum(int(s["bytes"]) for s in index["shards"])


@pytest.mark.slow
def test_a_survivor_s_next_generation_starts_without_the_failed_one_s_prefetch_or_workers(
    tmp_path: Path, s3_server: S3Server, s3_url: str
) -> None:
    """The failed generation's dataset kept its cache prefetch running (its window pinned in the shared budget
    until read) and could keep DataLoader workers with open shards: each warm hand-over added one more, and the
    first batches after the third and fourth waited seconds for room. Entering ``train`` again, the survivor
    has none of them left."""
    total = _write_data(s3_server, s3_url)
    run_dir = str(tmp_path / "run")
    cmd = warm_launch(run_dir)
    cmd += ["--faults", "kill@step=8,rank=1", "--collective-timeout", "4", "--", SCRIPT, "--url", s3_url]
    cmd += ["--cache", str(tmp_path / "cache"), "--budget", str(total // 3)]
    cmd += ["--options", json.dumps(s3_server.storage_options()), "--steps", "16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(run_dir, "warm", "agent.jsonl")) as f:
        assert [json.loads(line)["event"] for line in f] == ["warm_restart", "warm_restart_done"]
    with open(os.path.join(run_dir, "entries.jsonl")) as f:
        entries = [json.loads(line) for line in f]
    again = [e for e in entries if e["entry"] == 2]
    assert [e["rank"] for e in again] == [0], entries  # the survivor entered train a second time
    assert again[0]["cache_threads"] == [] and again[0]["workers"] == 0, again
