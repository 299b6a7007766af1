"""The resume comparison covers each step's random draws, not only its samples and the final state."""

from __future__ import annotations

import json
import os

from goodput.verify.demo import first_difference, read_run


def _write_run(run_dir: str, draws: dict[int, list[str]]) -> None:
    os.makedirs(os.path.join(run_dir, "samples"))
    with open(os.path.join(run_dir, "final.json"), "w") as f:
        json.dump({"step": 3, "model_sha256": "m", "optimizer_sha256": "o"}, f)
    with open(os.path.join(run_dir, "samples", "rank-0.jsonl"), "w") as f:
        for step in (1, 2, 3):
            f.write(json.dumps({"step": step, "samples": [step], "attempt": 0, "draws": draws[step]}) + "\n")


def test_a_different_draw_at_one_step_is_reported(tmp_path: os.PathLike[str]) -> None:
    same = {1: ["a1", "0x1p+0"], 2: ["a2", "0x1p+1"], 3: ["a3", "0x1p+2"]}
    _write_run(os.path.join(tmp_path, "ref"), same)
    _write_run(os.path.join(tmp_path, "same"), same)
    _write_run(
        os.path.join(tmp_path, "other"), {**same, 2: ["a2", "0x1.8p+1"]}
    )  # same samples, other loss bits
    ref = read_run(os.path.join(tmp_path, "ref"))
    assert first_difference(ref, read_run(os.path.join(tmp_path, "same"))) is None
    difference = first_difference(ref, read_run(os.path.join(tmp_path, "other")))
    assert difference is not None and "rank-0 step 2 drew" in difference and "0x1.8p+1" in difference
