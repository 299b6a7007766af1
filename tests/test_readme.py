"""The code in README.md and in every page of docs/ works as written.

Conventions, the same on every page:
- A ```python block is either run by a test of this file (found by a marker string it contains, listed in
  ``RUN``: only its placeholders, a bucket URL, ``storage_options={...}``, the user's model and step, are
  replaced), or an excerpt of a file the suite runs (``EXCERPTS``, checked by
  tests/integrations/test_integrations.py), or shown only, with the reason (``SHOWN``). A new block that is none
  of these fails ``test_every_python_block_is_run_or_accounted_for``.
- Every ```python block compiles, and every ``gp.NAME`` and ``from goodput... import NAME`` in it exists.
- Every ``goodput ...`` command in a ```sh block (and every ``$ goodput ...`` line of a ```text block) is accepted
  by goodput's own argument parser.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import goodput as gp
from goodput.checkpoint import list_checkpoints
from tests.helpers.paths import FIXTURES, ROOT
from tests.scripts._readme_loop import fit

PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]

RUN: dict[str, tuple[str, ...]] = {  # page -> markers of the python blocks the tests below run
    "README.md": ("# the run folder comes from goodput launch",),
    "docs/checkpoints.md": ("ckpt = gp.CheckpointManager(", "memory=gp.MemoryTier("),
    "docs/data.md": (
        "for batch in gp.DevicePrefetcher(loader)",
        "from datasets import load_dataset",
        "class Noisy(",
        "cache = gp.CacheConfig(",
        "gp.ShardedDataset(",
        "gp.FolderDataset(",
        "gp.ParquetDataset(",
        "gp.ArrowDataset(",
        "gp.TokenDataset(",
        "gp.WebDataset(",
        "gp.MDSDataset(",
    ),
    "docs/launch.md": ("def train(run):",),
    "docs/integrations.md": ("TensorBoardExporter(",),
    "docs/numeric-faults.md": ("numeric=gp.NumericConfig(",),
}
EXCERPTS: dict[str, tuple[str, ...]] = {  # checked line by line against a tested file (test_integrations.py)
    "docs/integrations.md": ("GoodputDDPStrategy(", "GoodputTrainer(", "PrometheusExporter(run_dir"),
}
SHOWN: dict[str, dict[str, str]] = {  # page -> marker -> why the block is not run here
    "docs/warm-restarts.md": {
        "def train(run: gp.Run)": "the warm example of docs/launch.md, which a test runs under goodput launch "
        "--restart warm, with the dataset built after Run (the same calls)",
    },
    "docs/stragglers.md": {
        "stragglers=gp.StragglerConfig()": "three configurations of gp.Run (alarm, stop, replace); "
        "tests/run/test_stragglers_launch.py runs each under goodput launch",
    },
}


def _blocks(page: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (ROOT / page).read_text(), flags=re.S)


def _python_block(page: str, containing: str) -> str:
    """The one ```python block of ``page`` that contains ``containing`` (a marker listed in RUN)."""
    assert containing in RUN.get(page, ()), f"add {containing!r} to RUN[{page!r}]"
    found = [b for b in _blocks(page, "python") if containing in b]
    assert len(found) == 1, f"expected one python block of {page} with {containing!r}, found {len(found)}"
    return found[0]


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_is_run_or_accounted_for(page: str) -> None:
    markers = [*RUN.get(page, ()), *EXCERPTS.get(page, ()), *SHOWN.get(page, {})]
    for block in _blocks(page, "python"):
        claimed = [m for m in markers if m in block]
        assert len(claimed) == 1, f"{page}: a python block is claimed by {claimed} (want one):\n{block[:300]}"
    for marker in markers:
        assert sum(marker in b for b in _blocks(page, "python")) == 1, f"{page}: no one block with {marker!r}"


def _goodput_names(tree: ast.AST) -> list[tuple[str, str]]:
    """(module, name) for every ``gp.NAME`` and ``from goodput[.x] import NAME`` in a block."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "gp":
            found.append(("goodput", node.attr))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "goodput":
            found.extend((str(node.module), alias.name) for alias in node.names)
    return found


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_compiles_and_names_what_goodput_has(page: str) -> None:
    for block in _blocks(page, "python"):
        tree = ast.parse(block, filename=page)
        for module, name in _goodput_names(tree):
            if module.startswith(
                "goodput.integrations."
            ):  # imports lightning/transformers: test_integrations
                continue
            assert hasattr(importlib.import_module(module), name), f"{page}: {module} has no {name}"


def _commands(page: str) -> list[str]:
    """The ``goodput ...`` command lines of a page's sh blocks and the ``$ goodput ...`` lines of its text blocks."""
    lines: list[str] = []
    for block in _blocks(page, "sh"):
        lines.extend(block.replace("\\\n", " ").splitlines())
    for block in _blocks(page, "text"):
        lines.extend(line[2:] for line in block.replace("\\\n", " ").splitlines() if line.startswith("$ "))
    return [line for line in lines if "goodput" in shlex.split(line, comments=True)]


@pytest.mark.parametrize("page", PAGES)
def test_every_goodput_command_is_accepted_by_the_parser(page: str) -> None:
    from goodput.cli import build_parser

    for line in _commands(page):
        words = shlex.split(line, comments=True)
        argv = words[words.index("goodput") + 1 :]
        try:
            build_parser().parse_args(argv)
        except SystemExit as stop:
            pytest.fail(f"{page}: goodput refuses {line.strip()!r} (exit {stop.code})")


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
        _python_block("docs/checkpoints.md", "ckpt = gp.CheckpointManager("),
        {
            '"s3://bucket/run1"': repr(str(root)),
            "storage_options={...}": "storage_options={}",
            '"auto"': "50",
        },
    )
    namespace = {**_tiny_training(), "steps": 213}
    exec(compile(code, "docs/checkpoints.md", "exec"), namespace)
    committed = [r.step for r in list_checkpoints(str(root)) if r.status == "committed"]
    assert max(committed) == 213
    assert namespace["start"] == 0
    again = {**_tiny_training(), "steps": 213}
    exec(compile(code, "docs/checkpoints.md", "exec"), again)
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
        compile(
            _python_block("docs/data.md", "for batch in gp.DevicePrefetcher(loader)"), "docs/data.md", "exec"
        ),
        namespace,
    )
    epoch0 = [i for batch in seen[:2] for i in batch]
    epoch1 = [i for batch in seen[2:] for i in batch]
    assert sorted(head.flatten().tolist() + epoch0) == list(range(96))
    assert sorted(epoch1) == list(range(96)) and len(seen) == 5


def _run_blocks(markers: dict[str, dict[str, str]], namespace: dict[str, Any]) -> dict[str, Any]:
    """Runs docs/data.md's blocks named by ``markers`` (marker -> placeholder replacements) in one namespace."""
    for marker, replacements in markers.items():
        code = _substitute(_python_block("docs/data.md", marker), replacements)
        exec(compile(code, f"docs/data.md ({marker})", "exec"), namespace)
    return namespace


def _cache(tmp_path: Path) -> dict[str, dict[str, str]]:
    return {"cache = gp.CacheConfig(": {'"/nvme/goodput-cache"': repr(str(tmp_path / "cache"))}}


def test_the_cache_and_sharded_dataset_snippets_read_shards(tmp_path: Path) -> None:
    from goodput.data.shards import write_shards

    url = str(tmp_path / "train")
    write_shards((bytes([i]) * 4 for i in range(10)), url, shard_bytes=16)
    blocks = {**_cache(tmp_path), "gp.ShardedDataset(": {'"s3://bucket/datasets/train"': repr(url)}}
    train = _run_blocks(blocks, {"gp": gp, "my_decode": bytes})["train"]
    assert [train[i] for i in range(10)] == [bytes([i]) * 4 for i in range(10)]
    assert len(os.listdir(tmp_path / "cache")) > 0


def test_the_folder_snippet_reads_one_sample_per_matching_file(tmp_path: Path) -> None:
    (tmp_path / "photos" / "b").mkdir(parents=True)
    (tmp_path / "photos" / "a.jpg").write_bytes(b"first")
    (tmp_path / "photos" / "b" / "c.jpg").write_bytes(b"second")
    (tmp_path / "photos" / "notes.txt").write_bytes(b"not a sample")
    blocks = {
        **_cache(tmp_path),
        "gp.FolderDataset(": {'"s3://bucket/photos"': repr(str(tmp_path / "photos"))},
    }
    images = _run_blocks(blocks, {"gp": gp})["images"]
    assert len(images) == 2 and [images[0], images[1]] == [b"first", b"second"]


class _Images:
    """Stands for the user's ``self.images`` in the Noisy example: 12 images of 2x3."""

    def __init__(self) -> None:
        self.images = torch.arange(12 * 6, dtype=torch.float32).reshape(12, 2, 3)


def test_the_per_sample_randomness_snippet_resumes_bit_for_bit() -> None:
    """The Noisy dataset under ResumableLoader: a loader restored after one batch yields the same augmented
    batches as an uninterrupted one, and the augmentation did change the samples."""
    namespace: dict[str, Any] = {"gp": gp, "torch": torch}
    exec(compile(_python_block("docs/data.md", "class Noisy("), "docs/data.md (Noisy)", "exec"), namespace)

    def dataset() -> Any:
        noisy = namespace["Noisy"]()
        noisy.images = _Images().images
        return noisy

    whole = [b.clone() for b in gp.ResumableLoader(dataset(), batch_size=4, seed=7)]
    first = gp.ResumableLoader(dataset(), batch_size=4, seed=7)
    next(iter(first))
    again = gp.ResumableLoader(dataset(), batch_size=4, seed=7)
    again.load_state_dict(first.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(list(again), whole[1:], strict=True))
    assert not any(torch.equal(b, _Images().images[:4]) for b in whole)


def test_the_memory_tier_snippet_configures_both_tiers(tmp_path: Path) -> None:
    code = _substitute(
        _python_block("docs/checkpoints.md", "memory=gp.MemoryTier("),
        {
            '"s3://bucket/run1"': repr(str(tmp_path / "run1")),
            '"/dev/shm/goodput"': repr(str(tmp_path / "shm")),
        },
    )
    namespace: dict[str, Any] = {"gp": gp}
    exec(compile(code, "docs/checkpoints.md (memory tier)", "exec"), namespace)
    memory = namespace["config"].memory
    assert (memory.every, memory.replicas, memory.keep) == ("auto", 1, 2)


def test_the_numeric_snippet_turns_on_the_guard_with_its_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one line of docs/numeric-faults.md makes a Run, and the values it names are the defaults it says."""
    monkeypatch.setenv("GOODPUT_RUN_DIR", str(tmp_path))
    code = _python_block("docs/numeric-faults.md", "numeric=gp.NumericConfig(")
    namespace: dict[str, Any] = {"gp": gp}
    exec(compile(code, "docs/numeric-faults.md", "exec"), namespace)
    namespace["run"].close()
    calls = [
        n
        for n in ast.walk(ast.parse(code))
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "gp.NumericConfig"
    ]
    shown = {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords if k.arg}
    assert shown and gp.NumericConfig(**shown) == gp.NumericConfig()


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
        _python_block("README.md", "# the run folder comes from goodput launch"),
        {"total_steps=10_000": "total_steps=12"},
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
        _python_block("docs/launch.md", "def train(run):"),
        {"total_steps=10_000": "total_steps=12", **replacements},
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
    from goodput.job.codes import EXIT_FATAL

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
        _python_block("docs/data.md", "from datasets import load_dataset"),
        {"from datasets import load_dataset": "", "num_workers=4": "num_workers=2"},  # 2 cores here
    )
    namespace: dict[str, Any] = {"gp": gp, "load_dataset": load_dataset}
    exec(compile(code, "docs/data.md", "exec"), namespace)
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
    code = _python_block("docs/integrations.md", "TensorBoardExporter(")
    exec(compile(code, "docs/integrations.md", "exec"), namespace)
    run = namespace["run"]
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = gp.ResumableLoader(torch.randn(64, 4), batch_size=4, seed=0)
    run.restore(model=model, optimizer=opt, loader=loader)
    fit(run, loader, lambda batch: model(batch).pow(2).mean(), opt)
    events = EventAccumulator(os.path.join(run_dir, "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("goodput/loss")] == list(range(1, 31))
    assert all(0.0 <= e.value <= 1.0 for e in events.Scalars("goodput/goodput"))
    capacity = [e.value for e in events.Scalars("goodput/capacity_goodput")]
    assert capacity == pytest.approx([e.value for e in events.Scalars("goodput/goodput")], rel=1e-3)  # 1 rank
    assert len(events.Scalars("goodput/fetch_seconds")) == 30


def test_the_format_snippets_read_each_format(tmp_path: Path) -> None:
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
    blocks = {
        **_cache(tmp_path),
        "gp.ParquetDataset(": {'"s3://bucket/hub/wikitext"': repr(str(tmp_path / "hub"))},
        "gp.ArrowDataset(": {'"/data/imdb-train"': repr(str(tmp_path / "imdb"))},
        "gp.TokenDataset(": {
            '"s3://bucket/fineweb/train.bin"': repr(str(tmp_path / "train.bin")),
            "seq_len=1024": "seq_len=4",
        },
        "gp.WebDataset(": {
            '"s3://bucket/laion/shard-{000000..000099}.tar"': repr(
                str(tmp_path / "wds" / "shard-{000000..000001}.tar")
            )
        },
        "gp.MDSDataset(": {'"s3://bucket/mds/c4"': repr(str(mds))},
    }
    namespace = _run_blocks(blocks, {"gp": gp})
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
