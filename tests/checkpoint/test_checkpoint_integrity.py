"""Damaged, partial and planted checkpoints are detected and skipped with a warning naming the file."""

from __future__ import annotations

import json
import logging
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState, list_checkpoints
from goodput.checkpoint.config import ALLOW_FRESH_START_ENV
from goodput.checkpoint.durable.dcp import SafeLoadPlanner, safe_unpickle_metadata
from goodput.checkpoint.durable.layout import MANIFEST_NAME
from goodput.errors import CheckpointCorrupt, NoValidCheckpoint, StateMismatch


def _manager(
    root: Path, strategy: str = "dcp", width: int = 4, **kw: object
) -> tuple[CheckpointManager, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Linear(width, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    config = CheckpointConfig(root=str(root), strategy=strategy, every=1, keep_last=5, **kw)  # type: ignore[arg-type]
    return CheckpointManager(config, TrainingState(model=model, optimizer=opt)), model


def _train_and_save(
    root: Path, steps: tuple[int, ...] = (2, 4), strategy: str = "dcp"
) -> dict[int, torch.Tensor]:
    manager, model = _manager(root, strategy)
    weights = {}
    for step in steps:
        with torch.no_grad():
            model.weight.add_(1.0)
        manager.save(step)
        manager.wait()
        weights[step] = model.weight.detach().clone()
    manager.close()
    return weights


def _restore(root: Path, strategy: str = "dcp") -> tuple[int | None, torch.Tensor]:
    manager, model = _manager(root, strategy)
    step = manager.restore_latest()
    manager.close()
    return step, model.weight.detach().clone()


def _shard(folder: Path) -> Path:
    return sorted(folder.glob("*.distcp"))[0]


def test_truncated_shard_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    weights = _train_and_save(tmp_path)
    shard = _shard(tmp_path / "step-4")
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 7)
    with caplog.at_level(logging.WARNING):
        step, weight = _restore(tmp_path)
    assert step == 2 and torch.equal(weight, weights[2])
    assert str(shard) in caplog.text and "bytes, the manifest says" in caplog.text


def test_flipped_byte_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    weights = _train_and_save(tmp_path)
    shard = _shard(tmp_path / "step-4")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        step, weight = _restore(tmp_path)
    assert step == 2 and torch.equal(weight, weights[2])
    assert (
        str(shard) in caplog.text and "xxh3_128" in caplog.text and "differs from the manifest" in caplog.text
    )


def test_missing_metadata_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    weights = _train_and_save(tmp_path)
    (tmp_path / "step-4" / ".metadata").unlink()
    with caplog.at_level(logging.WARNING):
        step, weight = _restore(tmp_path)
    assert step == 2 and torch.equal(weight, weights[2])
    assert str(tmp_path / "step-4" / ".metadata") in caplog.text and "missing" in caplog.text


def test_leftover_partial_folders_are_skipped_and_cleaned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    weights = _train_and_save(tmp_path)
    dead = tmp_path / "step-6.partial-0123abcd"  # a crashed save: its lease names a process that is gone
    dead.mkdir()
    (dead / "__0_0.distcp").write_bytes(b"half a shard")
    (dead / "goodput-lease.json").write_text(
        json.dumps({"host": os.uname().nodename, "pid": 2**22 + 7, "started": 0})
    )
    alive = tmp_path / "step-8.partial-4567abcd"  # a save in flight in a live process: never touched
    alive.mkdir()
    (alive / "goodput-lease.json").write_text(
        json.dumps({"host": os.uname().nodename, "pid": os.getppid(), "started": 0})
    )
    no_manifest = tmp_path / "step-10"  # an object-store style partial: step folder, lease, no manifest
    no_manifest.mkdir()
    (no_manifest / "goodput-lease.json").write_text(
        json.dumps({"host": os.uname().nodename, "pid": 2**22 + 7, "started": 0})
    )
    with caplog.at_level(logging.WARNING):
        step, weight = _restore(tmp_path)
    assert step == 4 and torch.equal(weight, weights[4])
    assert not dead.exists() and not no_manifest.exists()
    assert alive.exists()
    assert f"removing {dead}" in caplog.text


def test_malicious_metadata_is_refused_and_never_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    weights = _train_and_save(tmp_path)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    folder = tmp_path / "step-4"
    planted = pickle.dumps(Evil())
    (folder / ".metadata").write_bytes(planted)
    _rewrite_manifest_entry(
        folder, ".metadata", planted
    )  # verification passes: only the unpickler can stop it
    with pytest.raises(CheckpointCorrupt, match="refusing to load"):
        safe_unpickle_metadata(planted)
    with caplog.at_level(logging.WARNING):
        step, weight = _restore(tmp_path)
    assert not marker.exists()
    assert step == 2 and torch.equal(weight, weights[2])
    assert "refusing to load" in caplog.text


def test_malicious_torch_save_file_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    weights = _train_and_save(tmp_path, strategy="torch_save")
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    folder = tmp_path / "step-4"
    torch.save({"model": Evil()}, folder / "state.pt")
    _rewrite_manifest_entry(folder, "state.pt", (folder / "state.pt").read_bytes())
    with caplog.at_level(logging.WARNING):
        step, weight = _restore(tmp_path, strategy="torch_save")
    assert not marker.exists()
    assert step == 2 and torch.equal(weight, weights[2])
    assert "weights_only" in caplog.text


def test_non_tensor_values_load_without_running_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    dcp.save({"meta": Evil()}, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    with pytest.raises(CheckpointException) as info:
        dcp.load({"meta": ""}, checkpoint_id=str(tmp_path / "ck"), planner=SafeLoadPlanner(), no_dist=True)
    assert not marker.exists()
    ((failure, _trace),) = info.value.failures.values()
    assert isinstance(failure, CheckpointCorrupt) and "weights_only" in str(failure)


@pytest.mark.parametrize("strategy", ["torch_save", "dcp"])
def test_mismatched_model_names_key_and_both_shapes(tmp_path: Path, strategy: str) -> None:
    _train_and_save(tmp_path, steps=(2,), strategy=strategy)
    manager, _ = _manager(tmp_path, strategy, width=6)
    with pytest.raises(
        StateMismatch, match=r"model\.weight: the checkpoint has shape \[3, 4\], this run has \[3, 6\]"
    ):
        manager.restore_latest()
    manager.close()


def test_listing_reports_committed_partial_and_corrupt(tmp_path: Path) -> None:
    _train_and_save(tmp_path, steps=(2, 4, 6))
    (tmp_path / "step-4" / ".metadata").unlink()
    os.rename(tmp_path / "step-6", tmp_path / "step-6.partial-89abcdef")
    os.remove(tmp_path / "step-6.partial-89abcdef" / MANIFEST_NAME)
    rows = {(r.step, r.status) for r in list_checkpoints(str(tmp_path))}
    assert rows == {(2, "committed"), (4, "corrupt"), (6, "partial")}


def _rewrite_manifest_entry(folder: Path, name: str, data: bytes) -> None:
    import hashlib

    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_a_corrupt_step_is_saved_again_and_a_committed_one_is_never_overwritten(tmp_path: Path) -> None:
    _train_and_save(tmp_path)
    shard = _shard(tmp_path / "step-4")
    with open(shard, "r+b") as f:
        f.truncate(10)
    manager, model = _manager(tmp_path)
    assert manager.restore_latest() == 2
    assert manager.save(4).skipped is False  # the corrupt step-4 is replaced by a good one
    assert manager.save(2).skipped is True  # a committed, valid step is never rewritten
    manager.close()
    assert [(r.step, r.status) for r in list_checkpoints(str(tmp_path), checksums=True)] == [
        (4, "committed"),
        (2, "committed"),
    ]
    step, weight = _restore(tmp_path)
    assert step == 4 and torch.equal(weight, model.weight.detach())
    fresh, _ = _manager(tmp_path)  # a manager that restored nothing still finds step 4 committed on disk
    assert fresh.save(4).skipped is True
    fresh.close()


@pytest.mark.parametrize("strategy", ["dcp", "torch_save"])
def test_committed_checkpoints_of_which_none_loads_stop_the_restore(tmp_path: Path, strategy: str) -> None:
    _train_and_save(tmp_path, steps=(2, 4), strategy=strategy)
    (tmp_path / "step-4.partial-0123abcd").mkdir()  # a save killed before it committed is no checkpoint
    for step, damage in ((2, "truncate"), (4, "flip")):
        (data,) = [p for p in (tmp_path / f"step-{step}").iterdir() if p.suffix in (".distcp", ".pt")][:1]
        blob = bytearray(data.read_bytes())
        if damage == "truncate":
            blob = blob[:10]
        else:
            blob[len(blob) // 2] ^= 0x01
        data.write_bytes(bytes(blob))
    manager, model = _manager(tmp_path, strategy)
    before = model.weight.detach().clone()
    with pytest.raises(NoValidCheckpoint) as refused:
        manager.restore_latest()
    manager.close()
    (line,) = str(refused.value).splitlines()
    assert f"none of the 2 committed checkpoints under {tmp_path} could be loaded" in line
    assert "newest failure: step 4:" in line and "--allow-fresh-start" in line
    assert "allow_fresh_start=True" in line
    # with consent the run starts from step 0 and saves over the damaged step, so the next restore finds it
    fresh, model = _manager(tmp_path, strategy, allow_fresh_start=True)
    assert fresh.restore_latest() is None
    assert torch.equal(model.weight.detach(), before)
    assert fresh.save(4).skipped is False
    fresh.close()
    step, weight = _restore(tmp_path, strategy)
    assert step == 4 and torch.equal(weight, before)


def test_only_uncommitted_saves_start_from_scratch_without_consent(tmp_path: Path) -> None:
    """A job killed inside its very first save left folders without a manifest: nothing was ever committed."""
    (tmp_path / "step-2.partial-0123abcd").mkdir()
    (tmp_path / "step-2.partial-0123abcd" / "__0_0.distcp").write_bytes(b"half")
    (tmp_path / "step-3").mkdir()  # on an object store a killed first save leaves step-N/ without a manifest
    manager, _ = _manager(tmp_path)
    assert manager.restore_latest() is None
    manager.close()


def test_the_environment_allows_a_fresh_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """goodput launch --allow-fresh-start exports the variable to every worker; an explicit False wins."""
    _train_and_save(tmp_path, steps=(2,))
    (tmp_path / "step-2" / MANIFEST_NAME).write_text("{not json")
    monkeypatch.setenv(ALLOW_FRESH_START_ENV, "1")
    allowed, _ = _manager(tmp_path)
    assert allowed.restore_latest() is None
    allowed.close()
    refused, _ = _manager(tmp_path, allow_fresh_start=False)
    with pytest.raises(NoValidCheckpoint, match="unreadable manifest"):
        refused.restore_latest()
    refused.close()


def test_lightning_resumes_into_damaged_checkpoints_so_that_the_restore_stops(tmp_path: Path) -> None:
    """GoodputCallback.resume_path: checkpoints that all fail the listing's checks are no fresh start."""
    pytest.importorskip("lightning")
    from goodput.integrations.lightning import RESUME_PATH, GoodputCallback

    root = tmp_path / "ckpt"
    _train_and_save(root, steps=(2,))
    with open(_shard(root / "step-2"), "r+b") as f:
        f.truncate(10)
    for allow, expected in ((None, RESUME_PATH), (True, None)):
        config = CheckpointConfig(root=str(root), strategy="dcp", every=2, allow_fresh_start=allow)
        callback = GoodputCallback(str(tmp_path), checkpoint=config)
        assert callback.resume_path == expected
        callback.ledger.close("ok")
