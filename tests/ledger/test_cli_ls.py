"""``goodput ls``: committed, partial and corrupt rows, as a table and as JSON; bad input exits 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState
from goodput.cli import main


def _three_checkpoints(root: Path) -> None:
    model = torch.nn.Linear(4, 2)
    manager = CheckpointManager(
        CheckpointConfig(root=str(root), strategy="dcp", every=1, keep_last=5), TrainingState(model=model)
    )
    for step in (1, 2, 3):
        manager.save(step)
    manager.close()
    shard = next((root / "step-2").glob("*.distcp"))
    with open(shard, "ab") as f:
        f.write(b"junk")
    os.rename(root / "step-3", root / "step-3.partial-abcdef01")
    os.remove(root / "step-3.partial-abcdef01" / "goodput-manifest.json")


def test_ls_json_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _three_checkpoints(tmp_path)
    assert main(["ls", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["step"]: r for r in out["checkpoints"]}
    assert {s: r["status"] for s, r in rows.items()} == {1: "committed", 2: "corrupt", 3: "partial"}
    assert rows[1]["strategy"] == "dcp" and rows[1]["world_size"] == 1 and rows[1]["size_bytes"] > 0
    assert "bytes, the manifest says" in rows[2]["reason"]


def test_ls_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _three_checkpoints(tmp_path)
    assert main(["ls", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["STEP", "SAVED"]
    assert [line.split()[0] for line in lines[1:]] == ["3", "2", "1"]
    assert lines[1].endswith("partial: save did not commit")
    assert "corrupt: " in lines[2] and lines[3].endswith("committed")


def test_ls_missing_folder_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a folder" in err


def _trainer_checkpoint(folder: Path, *, ranks: int, data: tuple[int, ...], state: bool = True) -> None:
    """A checkpoint-N folder as the Hugging Face Trainer (and GoodputTrainer's data positions) leave it."""
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    for rank in range(ranks):
        (folder / f"rng_state_{rank}.pth").write_bytes(b"r")
    for rank in data:
        (folder / f"goodput-data-rank{rank}.json").write_text(
            json.dumps({"consumed": 8, "world_size": ranks})
        )
    if state:
        (folder / "trainer_state.json").write_text("{}")


def test_ls_lists_a_trainer_output_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from goodput.checkpoint._trainer_folders import resumable_trainer_checkpoint

    _trainer_checkpoint(tmp_path / "checkpoint-4", ranks=2, data=(0, 1))
    _trainer_checkpoint(tmp_path / "checkpoint-8", ranks=2, data=(0,))  # rank 1 killed while saving
    _trainer_checkpoint(tmp_path / "checkpoint-12", ranks=2, data=(), state=False)
    _trainer_checkpoint(tmp_path / "checkpoint-16", ranks=1, data=())  # a plain Trainer's
    assert main(["ls", str(tmp_path), "--json"]) == 0
    rows = {r["step"]: r for r in json.loads(capsys.readouterr().out)["checkpoints"]}
    assert [s for s in rows] == [16, 12, 8, 4]
    assert {s: r["status"] for s, r in rows.items()} == {
        16: "committed",
        12: "partial",
        8: "partial",
        4: "committed",
    }
    assert "GoodputTrainer does not resume from it" in rows[16]["reason"]
    assert "trainer_state.json" in rows[12]["reason"] and "of rank 1" in rows[8]["reason"]
    assert rows[4]["strategy"] == "hf_trainer" and rows[4]["world_size"] == 2 and rows[4]["size_bytes"] > 100
    # both ranks resume from the same folder: checkpoint-8 lacks rank 1's position, so rank 0 passes it too
    assert resumable_trainer_checkpoint(str(tmp_path), 0) == str(tmp_path / "checkpoint-4")
    assert resumable_trainer_checkpoint(str(tmp_path), 1) == str(tmp_path / "checkpoint-4")
    assert main(["ls", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:2] == ["STEP", "SAVED"]
