"""Checkpoint I/O: reused staging buffers, checksums computed while writing, the step-number save schedule, and
the restore's parts as events."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState
from goodput.checkpoint.durable.layout import MANIFEST_NAME, CheckpointLayout
from goodput.checkpoint.durable.staging import Stager
from goodput.cli import main
from goodput.errors import NoValidCheckpoint
from goodput.testing.dist import run_ranks
from tests.helpers.io_ranks import schedule_saves


def _job(root: Path, **kw: Any) -> tuple[CheckpointManager, torch.nn.Module, torch.optim.Optimizer, list]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    events: list[tuple[str, dict[str, Any]]] = []
    config = CheckpointConfig(root=str(root), every=1, keep_last=10, **kw)
    manager = CheckpointManager(
        config, TrainingState(model=model, optimizer=opt), on_event=lambda n, **f: events.append((n, f))
    )
    return manager, model, opt, events


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 16)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()]
    return tensors + [v.clone() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]


def test_stager_reuses_buffers_and_copies_values() -> None:
    stager = Stager()
    source = {"a": torch.arange(12.0).reshape(3, 4), "nested": [torch.ones(5), {"t": torch.zeros(2, 3).t()}]}
    source["n"] = 7
    first = stager.stage(source)
    pointers = [first["a"].data_ptr(), first["nested"][0].data_ptr(), first["nested"][1]["t"].data_ptr()]
    source["a"].add_(100.0)  # the training step changes the state after staging
    assert torch.equal(first["a"], torch.arange(12.0).reshape(3, 4)) and first["n"] == 7
    second = stager.stage(source)
    assert [
        second["a"].data_ptr(),
        second["nested"][0].data_ptr(),
        second["nested"][1]["t"].data_ptr(),
    ] == pointers
    assert torch.equal(second["a"], source["a"]) and torch.equal(
        second["nested"][1]["t"], source["nested"][1]["t"]
    )
    assert second["nested"][1]["t"].stride() == source["nested"][1]["t"].stride()
    assert stager.nbytes == (12 + 5 + 6) * 4
    source["a"] = torch.zeros(2, 2)  # a changed shape gets a new buffer; a removed key frees its buffer
    del source["nested"]
    third = stager.stage(source)
    assert torch.equal(third["a"], torch.zeros(2, 2)) and stager.nbytes == 16


def test_restores_are_bitwise_after_staging_buffer_reuse(tmp_path: Path) -> None:
    manager, model, opt, _ = _job(tmp_path, strategy="dcp_async")
    snapshots = {}
    for step in range(1, 5):
        _train(model, opt)  # changing values every save; the staging buffers are the same
        snapshots[step] = _snapshot(model, opt)
        manager.save(step)
        _train(model, opt)  # the state moves on while the write runs
        manager.wait()
    durable: Any = manager.tier("durable")
    strategy = durable.strategy
    assert strategy.stager.nbytes == sum(t.numel() * t.element_size() for t in snapshots[4])
    manager.close()
    for step in (4, 3, 2, 1):
        fresh, fmodel, fopt, _ = _job(tmp_path, strategy="dcp_async")
        assert fresh.restore_latest() == step
        restored = _snapshot(fmodel, fopt)
        fresh.close()
        assert all(torch.equal(a, b) for a, b in zip(restored, snapshots[step], strict=True)), step
        shutil.rmtree(tmp_path / f"step-{step}")


@pytest.mark.parametrize("strategy", ["dcp", "dcp_async", "torch_save"])
def test_checksums_are_computed_while_writing(tmp_path: Path, strategy: str) -> None:
    manager, model, opt, _ = _job(tmp_path, strategy=strategy)
    _train(model, opt)
    manager.save(1)
    manager.close()
    layout = CheckpointLayout(str(tmp_path))
    manifest = layout.read_manifest(str(tmp_path / "step-1"))
    assert manifest.files
    for name, entry in manifest.files.items():
        assert entry.checksum is not None and entry.checksum.startswith("xxh3_128:")
        read_back = layout.hash_file(str(tmp_path / "step-1" / name), "xxh3_128")
        assert entry.checksum == f"xxh3_128:{read_back}", name


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_flipped_byte_is_detected_on_restore_and_by_ls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manager, model, opt, _ = _job(tmp_path, strategy="dcp_async")
    for step in (1, 2):
        _train(model, opt)
        manager.save(step)
        manager.wait()
    manager.close()
    _flip(next((tmp_path / "step-2").glob("__0_*.distcp")))
    assert main(["ls", str(tmp_path), "--json"]) == 0  # sizes only: not noticed
    assert [r["status"] for r in json.loads(capsys.readouterr().out)["checkpoints"]] == ["committed"] * 2
    assert main(["ls", str(tmp_path), "--json", "--checksums"]) == 0
    rows = {r["step"]: r for r in json.loads(capsys.readouterr().out)["checkpoints"]}
    assert (
        rows[2]["status"] == "corrupt"
        and "xxh3_128" in rows[2]["reason"]
        and rows[1]["status"] == "committed"
    )
    fresh, *_ = _job(tmp_path, strategy="dcp_async")
    assert fresh.restore_latest() == 1
    fresh.close()


def test_sha256_option_and_old_sha256_manifests_still_verify(tmp_path: Path) -> None:
    manager, model, opt, _ = _job(tmp_path, strategy="dcp", checksum="sha256")
    _train(model, opt)
    manager.save(1)
    manager.close()
    folder = tmp_path / "step-1"
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    layout = CheckpointLayout(str(tmp_path))
    for name, entry in manifest["files"].items():
        digest = layout.hash_file(str(folder / name), "sha256")
        assert entry["checksum"] == f"sha256:{digest}"
        manifest["files"][name] = {"size": entry["size"], "sha256": digest}  # the form older versions wrote
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    fresh, *_ = _job(tmp_path, strategy="dcp")
    assert fresh.restore_latest() == 1
    fresh.close()
    _flip(next(folder.glob("__0_*.distcp")))
    fresh, *_ = _job(tmp_path, strategy="dcp")
    with pytest.raises(NoValidCheckpoint, match="sha256"):
        fresh.restore_latest()  # the only checkpoint no longer verifies: no silent fresh start
    fresh.close()
    assert "sha256" in layout.scan(checksums=True)[0].reason


def test_restore_parts_are_events(tmp_path: Path) -> None:
    manager, model, opt, _ = _job(tmp_path, strategy="dcp")
    _train(model, opt)
    manager.save(1)
    manager.close()
    fresh, _, _, events = _job(tmp_path, strategy="dcp")
    assert fresh.restore_latest() == 1
    fresh.close()
    parts = [fields for name, fields in events if name == "restore_parts"]
    assert len(parts) == 1 and parts[0]["step"] == 1
    keys = {"find_seconds", "verify_seconds", "read_seconds", "load_seconds", "position_seconds"}
    assert keys <= set(parts[0]) and all(parts[0][k] >= 0 for k in keys) and parts[0]["read_seconds"] > 0


@pytest.mark.slow
def test_every_rank_saves_at_the_same_step_time_based_and_auto(tmp_path: Path) -> None:
    for every in ("0.05s", "auto"):
        results = run_ranks(schedule_saves, 2, str(tmp_path), every, 120)
        saved = [r["saved"] for r in results]
        assert saved[0] == saved[1] and len(saved[0]) >= 2, (every, saved)
        # one question to rank 0 per save (plus the first steps, while the step time is measured), not per step
        assert results[0]["decisions"] == results[1]["decisions"] <= 3 * len(saved[0]) + 3 < 120, results


def test_restore_parts_reach_the_ledger_and_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from goodput.run.run import Run

    for attempt in (1, 2):
        config = CheckpointConfig(root=str(tmp_path / "ckpt"), strategy="dcp", every=2)
        run = Run(
            str(tmp_path), checkpoint=config, total_steps=4 * attempt, progress=False, hang_timeout=None
        )
        run.restore(model=torch.nn.Linear(4, 2))
        for _ in run.batches(list(range(8))):
            run.step_done()
        run.close()
    assert main(["report", str(tmp_path), "--json"]) == 0
    assert [p["step"] for p in json.loads(capsys.readouterr().out)["info"]["restore_parts"]] == [4]
    assert main(["report", str(tmp_path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "restore of step" in x)
    assert line.split(":")[0].strip() == "restore of step 4"
    assert all(f"{part} " in line for part in ("find", "verify", "read", "load", "position"))


@pytest.mark.parametrize(
    ("strategy", "checksums"), [("dcp", True), ("dcp_async", True), ("dcp_async", False)]
)
def test_restore_copies_straight_into_the_live_tensors(
    tmp_path: Path, strategy: str, checksums: bool
) -> None:
    """Every tensor item is copied from the checkpoint's bytes into the model's and optimizer's own storage (no
    tensor per item), bitwise, including a non-contiguous one; non-tensor values still load."""
    kw: dict[str, Any] = {"strategy": strategy, "verify_checksums": checksums}
    manager, model, opt, _ = _job(tmp_path, **kw)
    model.register_buffer("transposed", torch.randn(5, 7).t())  # saved with its strides
    _train(model, opt)
    saved = [*_snapshot(model, opt), model.transposed.clone()]
    manager.save(1)
    manager.close()
    fresh, fmodel, fopt, _ = _job(tmp_path, **kw)
    fmodel.register_buffer("transposed", torch.zeros(5, 7).t())
    _train(fmodel, fopt)  # the optimizer's state exists before the restore: it must be reused, not replaced
    pointers = [t.data_ptr() for t in _snapshot_live(fmodel, fopt)]
    assert fresh.restore_latest() == 1
    fresh.close()
    assert [t.data_ptr() for t in _snapshot_live(fmodel, fopt)] == pointers
    restored = [*_snapshot(fmodel, fopt), fmodel.transposed]
    assert all(torch.equal(a, b) for a, b in zip(restored, saved, strict=True))
    assert fmodel.transposed.stride() == (1, 7)


def _snapshot_live(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [p.detach() for p in model.parameters()] + [model.transposed]
    return tensors + [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]


def test_restore_reads_no_tensor_through_torch_load(tmp_path: Path) -> None:
    """goodput's DCP reader serves every tensor item from the verified bytes, none through DCP's torch.load path."""
    import torch.distributed.checkpoint as dcp

    from goodput.checkpoint.durable.dcp import SafeLoadPlanner, make_reader
    from goodput.checkpoint.durable.strategy import SaveContext

    manager, model, opt, _ = _job(tmp_path, strategy="dcp")
    _train(model, opt)
    manager.save(1)
    manager.close()
    layout = CheckpointLayout(str(tmp_path))
    ctx = SaveContext(layout, 0, 1, None, {"expected": layout.read_manifest(str(tmp_path / "step-1")).files})
    target = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    reader = make_reader(str(tmp_path / "step-1"), ctx)
    dcp.load(target, storage_reader=reader, planner=SafeLoadPlanner(allow_partial_load=True), no_dist=True)
    assert reader.direct_items == len(target["model"]) and reader.torch_items == 0
    assert all(torch.equal(target["model"][k], v) for k, v in model.state_dict().items())
