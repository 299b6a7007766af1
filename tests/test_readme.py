"""The README's code runs as written: each tested block is taken from README.md itself, and only its
placeholders (a bucket URL, ``storage_options={...}``, the user's model and step) are replaced."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import goodput as gp
from goodput.checkpoint import list_checkpoints
from tests.helpers.paths import FIXTURES

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_block(containing: str) -> str:
    """The README's one ```python block that contains ``containing``."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"expected one README python block with {containing!r}, found {len(found)}"
    return found[0]


def _substitute(code: str, replacements: dict[str, str]) -> str:
    for placeholder, value in replacements.items():
        assert placeholder in code, f"the README no longer has {placeholder!r}: update this test"
        code = code.replace(placeholder, value)
    return code


def _tiny_training() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 100)
    done: list[int] = []

    def train_step() -> None:
        model(torch.randn(8, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        done.append(1)

    return {"gp": gp, "model": model, "opt": opt, "sched": sched, "loader": None, "train_step": train_step}


def test_the_standalone_checkpoint_manager_snippet_keeps_the_end_of_the_run(tmp_path: Path) -> None:
    """213 steps with a save every 50: the newest checkpoint is step 213, not 200; a second run of the same
    code resumes there and trains nothing more."""
    root = tmp_path / "run1"
    code = _substitute(
        _python_block("ckpt = gp.CheckpointManager("),
        {
            '"s3://bucket/run1"': repr(str(root)),
            "storage_options={...}": "storage_options={}",
            '"auto"': "50",
        },
    )
    namespace = {**_tiny_training(), "steps": 213}
    exec(compile(code, "README.md (Checkpoints)", "exec"), namespace)
    committed = [r.step for r in list_checkpoints(str(root)) if r.status == "committed"]
    assert max(committed) == 213
    assert namespace["start"] == 0
    again = {**_tiny_training(), "steps": 213}
    exec(compile(code, "README.md (Checkpoints)", "exec"), again)
    assert again["start"] == 213


class _Numbers:
    """A map-style dataset whose sample i is the tensor [i] (module-level: DataLoader workers pickle it)."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index])


def test_the_data_loop_snippet_resumes_exactly_once() -> None:
    """A position saved after one batch of epoch 0 (32 of 96 samples): the README loop reads the other 64 of
    epoch 0, then all 96 of epoch 1, each once."""
    first = gp.ResumableLoader(_Numbers(), batch_size=32, seed=0)
    head = next(iter(first))
    saved = first.state_dict()
    seen: list[list[int]] = []

    def train_step(batch: torch.Tensor) -> None:
        seen.append(batch.flatten().tolist())

    namespace = {"gp": gp, "dataset": _Numbers(), "saved": saved, "epochs": 2, "train_step": train_step}
    exec(
        compile(_python_block("for batch in gp.DevicePrefetcher(loader)"), "README.md (data)", "exec"),
        namespace,
    )
    epoch0 = [i for batch in seen[:2] for i in batch]
    epoch1 = [i for batch in seen[2:] for i in batch]
    assert sorted(head.flatten().tolist() + epoch0) == list(range(96))
    assert sorted(epoch1) == list(range(96)) and len(seen) == 5


def test_the_cache_snippet_reads_a_sharded_dataset(tmp_path: Path) -> None:
    from goodput.data.shards import write_shards

    url = str(tmp_path / "train")
    write_shards((bytes([i]) * 4 for i in range(10)), url, shard_bytes=16)
    code = _substitute(
        _python_block("cache = gp.CacheConfig("),
        {'"/nvme/goodput-cache"': repr(str(tmp_path / "cache")), '"s3://bucket/datasets/train"': repr(url)},
    )
    namespace: dict[str, Any] = {"gp": gp, "my_decode": bytes}
    exec(compile(code, "README.md (cache)", "exec"), namespace)
    train = namespace["train"]
    assert [train[i] for i in range(10)] == [bytes([i]) * 4 for i in range(10)]


_LOOP_HEADER = """
import os
import torch
import goodput as gp

torch.manual_seed(0)
torch.set_num_threads(1)


class MyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.layer(x))


dataset = [torch.full((4,), float(i)) / 256 for i in range(256)]
"""


def _loop_script(tmp_path: Path) -> str:
    """The README's resilient loop as a script: only the user's model, dataset and run length filled in."""
    code = _substitute(
        _python_block("# the run folder comes from goodput launch"), {"total_steps=10_000": "total_steps=12"}
    )
    script = tmp_path / "train.py"
    script.write_text(_LOOP_HEADER + code)
    return str(script)


def _committed(run_dir: Path) -> list[int]:
    return [r.step for r in list_checkpoints(str(run_dir / "checkpoints")) if r.status == "committed"]


@pytest.mark.slow
def test_the_resilient_loop_runs_as_written(tmp_path: Path) -> None:
    """The README loop: `python train.py` as one rank, and `goodput launch --nproc 2` through a SIGKILL, each
    ends with the last step saved; the launched run restarted and resumed from a checkpoint."""
    script = _loop_script(tmp_path)
    single = tmp_path / "debug"
    env = {**os.environ, "GOODPUT_RUN_DIR": str(single)}
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert max(_committed(single)) == 12

    launched = tmp_path / "drill"
    done = subprocess.run(
        [sys.executable, "-m", "goodput", "launch", "--nproc", "2", "--max-restarts", "3",
         "--faults", "kill@step=7,rank=1", "--run-dir", str(launched), "--", script],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert max(_committed(launched)) == 12
    restored = [e for e in gp.read_events(str(launched), rank=0) if e["event"] == "checkpoint_restored"]
    assert restored and restored[-1]["step"] >= 1, "the restarted attempt did not resume from a checkpoint"


def _warm_script(tmp_path: Path, name: str, replacements: dict[str, str]) -> str:
    """The README's warm-restart example as a script, with the user's model and dataset filled in."""
    code = _substitute(
        _python_block("def train(run):"), {"total_steps=10_000": "total_steps=12", **replacements}
    )
    script = tmp_path / name
    script.write_text(_LOOP_HEADER + code)
    return str(script)


def _launch_warm(run_dir: Path, script: str, *faults: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "goodput", "launch", "--restart", "warm", "--nproc", "2", *faults,
         "--run-dir", str(run_dir), "--", script],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_the_warm_restart_example_survives_a_kill_and_a_train_without_the_run_is_one_line(
    tmp_path: Path,
) -> None:
    """The README's warm example under `goodput launch --restart warm`: a SIGKILLed rank is replaced warm and the
    run ends with its last step saved. The same script with `def train():` stops at once with exit 78 and one
    line naming the fix (before: every attempt raised a TypeError, a crash loop)."""
    from goodput.launch.launcher import EXIT_FATAL

    run_dir = tmp_path / "warm"
    done = _launch_warm(run_dir, _warm_script(tmp_path, "train.py", {}), "--faults", "kill@step=6,rank=1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert max(_committed(run_dir)) == 12
    assert any(e["event"] == "warm_restart" for e in gp.read_events(str(run_dir), rank=None))

    broken = _warm_script(tmp_path, "broken.py", {"def train(run):": "def train():"})
    done = _launch_warm(tmp_path / "broken", broken)
    assert done.returncode == EXIT_FATAL, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "def train(run)" in line]
    assert lines and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_run_warm_refuses_a_train_that_takes_no_run(tmp_path: Path) -> None:
    from goodput.errors import ConfigError

    run = gp.Run(str(tmp_path), total_steps=1, progress=False, hang_timeout=None)
    try:
        called: list[int] = []

        def train() -> None:
            called.append(1)

        with pytest.raises(ConfigError, match=r"define it as def train\(run\)"):
            run.warm(train)  # type: ignore[arg-type]
        assert called == []
        assert run.warm(lambda r: r.total_steps) == 1  # one that takes the run is called with it
    finally:
        run.close()


class _HFStandIn:
    """What the README's `load_dataset(...)` returns, as far as the loader uses it: a map-style table whose
    `with_format("torch", columns=...)` rows are dicts of tensors (the `datasets` package is not installed
    here; its `Dataset` has the same `__len__`, `__getitem__` and `with_format`)."""

    def __init__(self, rows: int, columns: tuple[str, ...] = ()) -> None:
        self.rows, self.columns = rows, columns

    def with_format(self, kind: str, columns: list[str]) -> _HFStandIn:
        assert kind == "torch"
        return _HFStandIn(self.rows, tuple(columns))

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        assert self.columns == ("input_ids", "labels")
        return {"input_ids": torch.full((6,), index), "labels": torch.full((6,), index + 1)}


def _loader_from_the_readme() -> Any:
    def load_dataset(*args: Any, **kwargs: Any) -> _HFStandIn:
        assert "streaming" not in kwargs
        return _HFStandIn(64 * 3)

    code = _substitute(
        _python_block("from datasets import load_dataset"),
        {"from datasets import load_dataset": "", "num_workers=4": "num_workers=2"},  # 2 cores here
    )
    namespace: dict[str, Any] = {"gp": gp, "load_dataset": load_dataset}
    exec(compile(code, "README.md (datasets)", "exec"), namespace)
    return namespace["loader"]


def test_a_hugging_face_style_dataset_resumes_exactly_once() -> None:
    """The README's Dataset example (4 workers, batches of 32 dicts of tensors): a position saved after 2
    batches resumes in a new loader with the other 4 batches of the epoch, each row once."""
    first = _loader_from_the_readme()
    iterator = iter(first)
    head = [next(iterator), next(iterator)]
    assert head[0]["input_ids"].shape == (32, 6) and torch.equal(head[0]["labels"], head[0]["input_ids"] + 1)
    saved = first.state_dict()
    del iterator
    again = _loader_from_the_readme()
    again.load_state_dict(saved)
    rest = list(again)
    rows = [int(b["input_ids"][i, 0]) for b in head + rest for i in range(32)]
    assert len(rest) == 4 and sorted(rows) == list(range(64 * 3))


def test_an_iterable_dataset_is_refused_with_what_to_do() -> None:
    class Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter(range(10))

    with pytest.raises(gp.ConfigError, match=r"IterableDataset: .*streaming=True.*gp.ShardedDataset"):
        gp.ResumableLoader(Stream(), batch_size=2, seed=0)


def test_the_tensorboard_exporter_excerpt_records_every_step(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = str(tmp_path)
    config = gp.CheckpointConfig(root=os.path.join(run_dir, "ckpt"), strategy="torch_save", every=10)
    namespace: dict[str, Any] = {"gp": gp, "os": os, "run_dir": run_dir, "config": config}
    exec(compile(_python_block("TensorBoardExporter("), "README.md (exporters)", "exec"), namespace)
    run = namespace["run"]
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = gp.ResumableLoader(torch.randn(64, 4), batch_size=4, seed=0)
    run.restore(model=model, optimizer=opt, loader=loader)
    for batch in run.batches(loader):
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        run.step_done(loss=loss.item())
    run.close()
    events = EventAccumulator(os.path.join(run_dir, "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("goodput/loss")] == list(range(1, 31))
    assert all(0.0 <= e.value <= 1.0 for e in events.Scalars("goodput/goodput"))
    assert len(events.Scalars("goodput/fetch_seconds")) == 30


def test_the_in_place_formats_snippet_reads_each_format(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("datasets")
    import datasets
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["a", "b"], "n": [1, 2]}), hub / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": ["z"], "n": [0]}), hub / "test-00000-of-00001.parquet")
    datasets.Dataset.from_dict({"text": ["good", "bad"], "label": [1, 0]}).save_to_disk(
        str(tmp_path / "imdb")
    )
    np.arange(30, dtype=np.uint16).tofile(tmp_path / "train.bin")
    import io
    import tarfile

    (tmp_path / "wds").mkdir()
    for k in range(2):
        with tarfile.open(tmp_path / "wds" / f"shard-{k:06d}.tar", "w") as tar:
            for name in (f"s{k}.jpg", f"s{k}.txt", f"s{k}.json"):
                member = tarfile.TarInfo(name)
                member.size = len(name)
                tar.addfile(member, io.BytesIO(name.encode()))
    mds = FIXTURES / "mds" / "zstd-60"
    code = _substitute(
        _python_block("gp.TokenDataset("),
        {
            '"s3://bucket/hub/wikitext"': repr(str(tmp_path / "hub")),
            '"/data/imdb-train"': repr(str(tmp_path / "imdb")),
            '"s3://bucket/fineweb/train.bin"': repr(str(tmp_path / "train.bin")),
            "seq_len=1024": "seq_len=4",
            '"s3://bucket/laion/shard-{000000..000099}.tar"': repr(
                str(tmp_path / "wds" / "shard-{000000..000001}.tar")
            ),
            '"s3://bucket/mds/c4"': repr(str(mds)),
        },
    )
    cache = gp.CacheConfig(folder=str(tmp_path / "cache"), budget_bytes=1 << 20)
    namespace: dict[str, Any] = {"gp": gp, "cache": cache}
    exec(compile(code, "README.md (in-place formats)", "exec"), namespace)
    assert [namespace["text"][i] for i in range(2)] == [{"text": "a"}, {"text": "b"}]
    assert namespace["reviews"][1] == ("bad", 0)
    assert len(namespace["tokens"]) == 6 and namespace["tokens"][5].tolist() == list(range(25, 30))
    assert namespace["pairs"][1] == {
        "__key__": "s1",
        "__url__": str(tmp_path / "wds" / "shard-000001.tar"),
        "jpg": b"s1.jpg",
        "txt": b"s1.txt",
    }
    assert len(namespace["c4"]) == 60 and namespace["c4"][7] == {"text": "row 7"}
    batches = [b.tolist() for b in namespace["loader"]]
    assert sorted(w[0] for b in batches for w in b) == list(range(0, 30, 5))
