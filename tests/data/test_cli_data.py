"""``goodput data write``: each sample keeps its key (its relative path), and a store that refuses the write
(no or wrong credentials) is one line and exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from goodput.cli import main
from goodput.data.shards import ShardedDataset
from goodput.testing import S3Server
from tests.helpers.commands import s3_env


def _samples(folder: Path) -> Path:
    for rel, text in {"cat/001.txt": "meow", "cat/002.txt": "purr", "dog/001.txt": "woof"}.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def test_each_sample_keeps_its_relative_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _samples(tmp_path / "samples")
    out = tmp_path / "shards"
    assert main(["data", "write", str(src), str(out), "--shard-size", "8B"]) == 0
    assert "wrote 3 samples in" in capsys.readouterr().out
    data = ShardedDataset(str(out))
    labelled = [(data.key(i), bytes(data[i]).decode()) for i in range(len(data))]
    assert labelled == [("cat/001.txt", "meow"), ("cat/002.txt", "purr"), ("dog/001.txt", "woof")]
    assert [str(data.key(i)).split("/")[0] for i in range(len(data))] == ["cat", "cat", "dog"]
    assert data.key(-1) == "dog/001.txt"
    with pytest.raises(IndexError):
        data.key(3)


@pytest.mark.s3
@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ({}, "Unable to locate credentials"),
        ({"AWS_ACCESS_KEY_ID": "nobody", "AWS_SECRET_ACCESS_KEY": "nothing"}, "403"),
    ],
    ids=["no-credentials", "wrong-credentials"],
)
def test_a_refused_write_is_one_line_and_exit_2(
    keys: dict[str, str], says: str, s3_server: S3Server, tmp_path: Path
) -> None:
    env = s3_env(s3_server, tmp_path, keys)
    url = f"s3://{s3_server.bucket}/refused"
    done = subprocess.run(
        [sys.executable, "-m", "goodput", "data", "write", str(_samples(tmp_path / "samples")), url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("goodput data: error: cannot write s3://")
    assert says in done.stderr and "AWS_ACCESS_KEY_ID" in done.stderr
    assert "nothing" not in done.stderr  # the secret is never shown
